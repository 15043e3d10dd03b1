"""Training end to end: it learns, it runs through Ray actors like in-process, the Python API."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import raysim
from raysim.checkpoint import locate_checkpoint
from raysim.cli import main
from raysim.coordinator import Summary
from raysim.records import read_metrics as stored_rows
from raysim.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint"}  # the only
# metrics that may differ between two identical runs

TINY = [
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.update_epochs=2",
    "algo.num_minibatches=2",
    "train.total_steps=768",  # 3 iterations of 2 shards x 4 rows x 32 steps
    "train.log_every=1",
    "shards.count=2",
    "eval.episodes=4",
    "eval.num_envs=2",
    "eval.every=2",
]


def run(config) -> Summary:
    return raysim.Trainer(config, sinks=None).train()


def test_ppo_on_native_cartpole_clearly_improves_with_a_fixed_seed(tmp_path):
    config = raysim.load_config(
        None,
        overrides=[
            "backend=local",
            "seed=1",
            "train.total_steps=16384",
            "train.log_every=4",
            "eval.episodes=20",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    summary = run(config)
    assert summary.iterations == 16 and summary.env_steps == 16384
    # a random CartPole policy averages ~22; these are far above it
    assert summary.metrics["episode_return"] > 100, summary.metrics
    assert summary.evaluation.completed == 20
    assert summary.evaluation.mean_return > 200, summary.evaluation.returns
    assert summary.metrics["skipped_updates"] == 0


def test_the_python_api_trains_and_returns_a_summary(tmp_path):
    config = raysim.load_config(
        None,
        overrides=[
            *TINY,
            "backend=local",
            "shards.count=1",
            "eval.episodes=2",
            "eval.every=0",
            f"run_dir={tmp_path / 'api'}",
        ],
    )
    summary = raysim.Trainer(config).train()
    assert isinstance(summary, raysim.Summary)
    assert summary.iterations == 6  # 768 env steps of 1 shard x 4 rows x 32 steps
    assert summary.env_steps == 768
    assert summary.wall_time > 0 and summary.startup_time >= 0
    assert Path(summary.run_dir) == tmp_path / "api"
    for name in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "env_steps", "policy_version"):
        assert name in summary.metrics, name
    assert summary.metrics["policy_version"] == summary.iterations
    assert not summary.interrupted
    assert summary.evaluation is not None and summary.evaluation.requested == 2


def read_metrics(run_dir: Path) -> list[dict]:
    rows = stored_rows(open_storage(run_dir))
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.slow
def test_a_run_through_ray_actors_writes_its_run_directory_and_equals_the_local_run(ray_session, tmp_path):
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    on_ray = run(raysim.load_config(None, overrides=[*TINY, "backend=ray", f"run_dir={ray_dir}"]))
    assert ray_session.is_initialized()  # the Trainer did not start this Ray, so it left it running
    # ...and it leaves no actors holding its CPUs behind (they go with their handles)
    deadline = time.monotonic() + 30
    while ray_session.available_resources().get("CPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray_session.available_resources().get("CPU", 0) == 4

    assert Path(on_ray.run_dir) == ray_dir
    assert on_ray.iterations == 3 and on_ray.env_steps == 768
    snapshot = raysim.load_config(ray_dir / "configs" / "train.yaml")
    assert snapshot.shards.count == 2 and snapshot.backend == "ray" and snapshot.train.total_steps == 768
    rows = read_metrics(ray_dir)
    assert [r["iteration"] for r in rows] == [1.0, 2.0, 3.0]
    assert rows[-1]["env_steps"] == 768 and rows[-1]["policy_version"] == 3
    assert "eval_return" in rows[1]  # eval.every=2
    _, _, state, meta = locate_checkpoint(ray_dir / "checkpoints" / "3")
    assert meta["iteration"] == 3 and meta["env_steps"] == 768
    assert state["version"] == 3
    assert all(torch.is_tensor(v) for v in state["model"].values())

    on_local = run(raysim.load_config(None, overrides=[*TINY, "backend=local", f"run_dir={local_dir}"]))
    local_rows = read_metrics(local_dir)
    assert len(local_rows) == len(rows)
    for ray_row, local_row in zip(rows, local_rows, strict=True):
        assert ray_row.keys() == local_row.keys()
        differ = {k: (ray_row[k], local_row[k]) for k in ray_row if not same(ray_row[k], local_row[k])}
        assert not differ, differ
    _, _, local_state, _ = locate_checkpoint(local_dir / "checkpoints" / "3")
    for name, tensor in state["model"].items():
        assert torch.equal(tensor, local_state["model"][name]), name
    assert on_ray.evaluation.returns == on_local.evaluation.returns
    assert on_ray.evaluation.completed == on_local.evaluation.completed == 4


@pytest.mark.slow
def test_a_users_own_script_runs_the_trainer_on_its_own_ray(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    run_dir = tmp_path / "cartpole_ppo"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_from_script.py"),
            "--quick",  # its task page's quick mode, with a smaller budget still
            "--out",
            str(tmp_path),
            "256",
            "env.num_envs=4",
            "algo.num_steps=32",
            "algo.update_epochs=1",
            "train.total_steps=256",
            "eval.episodes=2",
            "eval.num_envs=2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "env steps: 256" in out
    assert "iterations: 2" in out
    assert "evaluation: 2/2 episodes" in out
    assert f"run directory: {run_dir}" in out
    assert "ray still initialized after train(): True" in out
    assert stored_rows(open_storage(run_dir))
    assert (run_dir / "checkpoints" / "2" / "state.pt").is_file()


def test_the_raysim_command_finds_an_env_module_in_the_current_folder(tmp_path, monkeypatch):
    """``env.id: my_env:MyCoin`` from the folder that holds ``my_env.py``, as ``python -m raysim`` would (the
    ``raysim`` script's own path lacks the current folder)."""
    (tmp_path / "my_env.py").write_text(
        "from tests.support.coin import Coin\n\n\nclass MyCoin(Coin):\n    env_id = 'my_env:MyCoin'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    settings = ["env.id=my_env:MyCoin", "env.num_envs=2", "algo.num_steps=8", "train.total_steps=16", "eval.episodes=2"]
    assert main(["train", "--local", *[f"--set={s}" for s in settings]]) == 0
    assert str(tmp_path) in sys.path and (tmp_path / "runs" / "cartpole_ppo" / "checkpoints").is_dir()
