"""MuJoCo tasks through the Gymnasium adapter: ``gym:HalfCheetah-v5`` and friends (``raysim[mujoco]``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco", reason='MuJoCo is not installed (pip install "raysim[mujoco]")')

import raysim  # noqa: E402
from raysim.records import read_metrics  # noqa: E402
from raysim.storage import open_storage  # noqa: E402


@pytest.fixture(autouse=True)
def _mujoco_log_in_tmp(tmp_path, monkeypatch):
    """MuJoCo appends its warnings to MUJOCO_LOG.TXT in the working directory: keep it out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("gym_id", ["HalfCheetah-v5", "Hopper-v5", "Ant-v5"])
def test_mujoco_ids_follow_the_step_contract(gym_id):
    env = raysim.envs.make(f"gym:{gym_id}", 3, seed=0, max_episode_steps=40)
    obs = env.reset(0)
    space = env.observation_spaces["policy"]
    assert obs["policy"].dtype == torch.float32 and obs["policy"].shape == (3, *space.shape)  # float64 -> float32
    assert env.max_episode_steps == 40
    generator = torch.Generator().manual_seed(0)
    ends = 0
    for _ in range(45):
        step = env.step(torch.rand(3, *env.action_space.shape, generator=generator) * 2 - 1)
        assert step.obs["policy"].dtype == torch.float32 and torch.isfinite(step.obs["policy"]).all()
        if step.done_rows.numel():
            ends += step.done_rows.numel()
            assert step.final_obs["policy"].dtype == torch.float32
            assert step.final_obs["policy"].shape == (step.done_rows.numel(), *space.shape)
            assert (step.episodes["length"] <= 40).all()
    assert ends >= 3  # every row reached the step limit (or terminated) at least once
    again = raysim.envs.make(f"gym:{gym_id}", 3, seed=0, max_episode_steps=40).reset(0)
    torch.testing.assert_close(again["policy"], obs["policy"], rtol=0, atol=0)  # seeded resets reproduce
    env.close()


def test_halfcheetah_config_trains_a_few_iterations(tmp_path):
    config = raysim.load_config(
        "halfcheetah_ppo",
        [
            "backend=local",
            "train.total_steps=1024",
            "algo.num_steps=512",
            "algo.num_minibatches=4",
            "eval.episodes=2",
            "eval.num_envs=2",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    assert config.env.id == "gym:HalfCheetah-v5" and config.algo.update_epochs == 10
    summary = raysim.Trainer(config).train()
    assert summary.env_steps == 1024
    assert summary.evaluation.completed == 2 and np.isfinite(summary.evaluation.mean_return)


@pytest.mark.slow
def test_hopper_config_improves_its_training_return_over_a_small_budget(tmp_path):
    """The packaged hopper_ppo (observation normalization, reward scaling) learns: seed 1, 6 iterations."""
    config = raysim.load_config(
        "hopper_ppo",
        [
            "backend=local",
            "train.total_steps=12288",
            "eval.episodes=0",
            "train.sinks=[parquet]",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    assert config.model.obs_norm and config.algo.reward_scale
    raysim.Trainer(config).train()
    rows = read_metrics(open_storage(str(tmp_path / "run")))
    first, last = rows[0]["episode_return"], rows[-1]["episode_return"]
    assert len(rows) == 6 and last > 3 * first, (first, last)  # seed 1, lockstep as packaged: 15 -> 144


def test_bench_mujoco_names_an_unknown_config(capsys):
    from raysim.cli import main

    assert main(["bench", "mujoco", "--configs", "nope_ppo", "--out", "out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config file 'nope_ppo' not found" in err[0] and "hopper_ppo.yaml" in err[0]


def test_bench_mujoco_runs_only_the_missing_runs(tmp_path, capsys):
    """Finished runs in results.jsonl are not trained again: the table comes from them."""
    from raysim.bench import mujoco
    from raysim.bench.results import installed_version

    (tmp_path / "curves").mkdir()
    lines = []
    for peer, seconds, ret in (("raysim", 50.0, 1500.0), ("cleanrl", 100.0, 1200.0)):
        curve = f"curves/{peer}.csv"
        (tmp_path / curve).write_text("env_steps,episode_return,episodes\n1000,-300,1\n2000,1500,1\n")
        lines.append(
            {
                "peer": peer,
                "config": "hopper_ppo",
                "env": "Hopper-v5",
                "seed": 7,
                "steps": 2048,
                "env_steps": 2048,
                "train_seconds": seconds,
                "layout": "-",
                "training_return": ret,
                "eval_mean": 1000.0,
                "eval_std": 0.0,
                "eval_episodes": 20,
                "curve": curve,
                "mujoco": installed_version("mujoco"),
            }
        )  # fmt: skip  (on this MuJoCo: a run on another is another run)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["--configs", "hopper_ppo", "--seeds", "7", "--steps", "2048", "--out", str(tmp_path)]
    assert mujoco.main(argv) == 0
    out = capsys.readouterr().out
    assert "| Hopper-v5 | 2,048 | raysim | 7 | 1,500.0 +- 0.0 | 1,000.0 +- 0.0 | - | 50.0 +- 0.0 |" in out
    assert "training seconds per env step 0.50x; training return 1,500.0 vs 1,200.0 (1.25x)" in out
    assert "| Hopper-v5 | 1,000,000 | CleanRL, published (v4) | - | 2,382.9 +- 271.7 |" in out
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "table.md").read_text() in out
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2  # nothing was trained


def test_bench_mujoco_tables_the_successes_of_reach(tmp_path, capsys):
    """reach_ppo (raysim/Reach, no MuJoCo, no peer): each seed's k/n with its Wilson lower end, no anchors."""
    from raysim.bench import mujoco

    (tmp_path / "curves").mkdir()
    lines = []
    for seed, k in ((1, 394), (2, 397)):
        curve = f"curves/reach-{seed}.csv"
        (tmp_path / curve).write_text("env_steps,episode_return,episodes\n1000,-80,10\n2000,-1,30\n")
        lines.append(
            {"peer": "raysim", "config": "reach_ppo", "env": "raysim/Reach", "seed": seed, "steps": 2048,
             "env_steps": 2048, "train_seconds": 150.0, "layout": "-", "training_return": -1.0, "eval_mean": 0.0,
             "eval_std": 0.0, "eval_episodes": 400, "eval_successes": k,
             "eval_success_lower": mujoco.wilson(k, 400)[0], "curve": curve}
        )  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["--configs", "reach_ppo", "--seeds", "1", "2", "--steps", "2048", "--out", str(tmp_path)]
    assert mujoco.main(argv) == 0  # the default peers: cleanrl has no Gymnasium id to run here
    out = capsys.readouterr().out
    row = "| raysim/Reach | 2,048 | raysim | 1,2 | -1.0 +- 0.0 | 0.0 +- 0.0 | 394/400 (0.968), 397/400 (0.978) |"
    assert row in out
    assert "published" not in out and len((tmp_path / "results.jsonl").read_text().splitlines()) == 2


def test_last_episodes_return_weighs_rows_by_their_episodes():
    from raysim.bench.mujoco import last_episodes_return

    curve = [(1, 0.0, 5), (2, 10.0, 6), (3, 20.0, 4)]  # the last 10 episodes lie in the last two rows
    assert last_episodes_return(curve) == pytest.approx((10.0 * 6 + 20.0 * 4) / 10)
    assert last_episodes_return([]) is None
