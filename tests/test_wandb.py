"""The Weights & Biases sink (``train.sinks: [..., wandb]``): against a fake ``wandb`` module, the rows it logs are the
Parquet rows one to one, the config is given once, a resumed run continues the same W&B run, a filmed evaluation is
logged as a video; the real ``wandb`` in offline mode; a missing ``wandb`` is one line and the run goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import raysim
from raysim.config import to_dict
from raysim.records import read_metrics
from raysim.storage import open_storage
from tests.support.fake_wandb import fake_wandb_module

# 1 shard x 4 rows x 32 steps = 128 env steps per iteration: 6 iterations
TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=768",
    "train.log_every=1",
    "eval.episodes=2",
    "eval.num_envs=2",
    "train.sinks=[parquet,wandb]",
]


@pytest.fixture
def fake_wandb(monkeypatch) -> list:
    """A fake ``wandb`` module in ``sys.modules``; the list of every call made to it, in order."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb_module(calls))
    for name in ("WANDB_DIR", "WANDB_NAME"):
        monkeypatch.delenv(name, raising=False)
    return calls


def tiny(run_dir: Path, *overrides: str) -> raysim.Config:
    return raysim.load_config(None, [*TINY, *overrides, f"run_dir={run_dir}"])


def train(run_dir: Path, *overrides: str) -> raysim.Summary:
    return raysim.Trainer(tiny(run_dir, *overrides)).train()


def logged_rows(calls: list) -> list[dict]:
    return [call[1] for call in calls if call[0] == "log" and "eval_video" not in call[1]]


def test_the_rows_logged_to_wandb_are_the_parquet_rows_one_to_one_and_the_config_is_given_once(tmp_path, fake_wandb):
    summary = train(tmp_path / "run", "eval.every=3")
    rows = read_metrics(open_storage(tmp_path / "run"))
    assert summary.iterations == 6 and len(rows) == 6 and "eval_return" in rows[2]  # the evaluation after 3
    assert logged_rows(fake_wandb) == rows  # the same keys and values, in the same order
    inits = [call[1] for call in fake_wandb if call[0] == "init"]
    assert len(inits) == 1 and inits[0]["config"] == to_dict(tiny(tmp_path / "run", "eval.every=3"))
    assert inits[0]["resume"] is None and inits[0]["name"] == "run"
    assert inits[0]["dir"] == str(tmp_path / "run")  # W&B's files beside the run's (WANDB_DIR unset)
    assert ("define_metric", "*", "env_steps") in fake_wandb  # plotted against the env steps
    assert fake_wandb[-1] == ("finish", None)
    kept = json.loads((tmp_path / "run" / "wandb.json").read_text())
    assert kept == {"id": "fake-id", "project": "fake-project", "entity": "fake-entity"}


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, fake_wandb):
    train(tmp_path / "run", "train.stop_after=2")
    raysim.Trainer.from_run_dir(tmp_path / "run").train()
    inits = [call[1] for call in fake_wandb if call[0] == "init"]
    assert [(i["id"], i["resume"], i["project"], i["entity"]) for i in inits] == [
        (None, None, None, None),
        ("fake-id", "allow", "fake-project", "fake-entity"),  # what wandb.json kept
    ]
    assert inits[1]["allow_val_change"] and inits[1]["config"]["train"]["sinks"] == ["parquet", "wandb"]
    assert logged_rows(fake_wandb) == read_metrics(open_storage(tmp_path / "run"))  # both processes' rows, once
    assert [r["iteration"] for r in logged_rows(fake_wandb)] == [1, 2, 3, 4, 5, 6]
    assert [call[0] for call in fake_wandb].count("finish") == 2


def test_a_filmed_evaluation_is_logged_as_a_video_at_its_env_steps(tmp_path, fake_wandb):
    run = tmp_path / "run"
    train(run, "eval.every=3", "eval.video=true", "eval.video_size=32", "eval.max_steps=20")
    films = sorted(int(p.stem) for p in (run / "videos").glob("*.mp4"))
    assert films == [3, 6]  # after iteration 3, and the final evaluation of iteration 6
    videos = [call[1] for call in fake_wandb if call[0] == "log" and "eval_video" in call[1]]
    steps = {int(r["iteration"]): r["env_steps"] for r in read_metrics(open_storage(run))}
    assert [(v["eval_video"].caption, v["env_steps"]) for v in videos] == [(f"iteration {i}", steps[i]) for i in films]
    for iteration, video in zip(films, videos, strict=True):
        assert video["eval_video"].data == (run / "videos" / f"{iteration}.mp4").read_bytes()
        assert video["eval_video"].format == "mp4" and set(video) == {"eval_video", "env_steps"}


def wandb_core_children() -> list[str]:
    """The wandb service processes this process started (``pgrep``: children whose command names wandb)."""
    found = subprocess.run(["pgrep", "-a", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "wandb" in line]


def test_the_real_wandb_in_offline_mode_keeps_one_run_across_a_resume(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wb"), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "wb").mkdir()
    run = tmp_path / "run"
    train(run, "train.stop_after=3", "eval.every=2", "eval.video=true", "eval.video_size=32", "eval.max_steps=20")
    raysim.Trainer.from_run_dir(run).train()
    try:
        assert "metrics sink" not in capsys.readouterr().err  # neither created with a failure nor failed later
        kept = json.loads((run / "wandb.json").read_text())
        offline = sorted(p.name for p in (tmp_path / "wb" / "wandb").glob("offline-run-*"))
        # one per process: offline-run-<time>-<id>, with a suffix (-1) when both began in the same second
        assert len(offline) == 2 and all(f"-{kept['id']}" in name for name in offline), offline
        assert not (run / "wandb").exists()  # WANDB_DIR set: W&B's files there (binary: not read back)
    finally:
        wandb.teardown()  # the service a process keeps for its later runs (it also ends with the process)
    assert wandb_core_children() == []


def test_a_missing_wandb_is_one_line_naming_the_extra_and_training_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    summary = train(tmp_path / "run")
    lines = [line for line in capsys.readouterr().err.splitlines() if "wandb" in line]
    assert len(lines) == 1
    assert lines[0].startswith("raysim: metrics sink 'wandb' could not be created: ImportError: ")
    assert 'pip install -e ".[wandb]"' in lines[0] and lines[0].endswith("training goes on with parquet")
    assert len(read_metrics(open_storage(tmp_path / "run"))) == summary.iterations == 6
    assert not (tmp_path / "run" / "wandb.json").exists()


def test_a_missing_wandb_as_the_only_sink_that_keeps_records_leaves_parquet_in_its_place(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    summary = train(tmp_path / "run", "train.sinks=[console,wandb]")
    lines = [line for line in capsys.readouterr().err.splitlines() if "wandb" in line]
    assert len(lines) == 1 and lines[0].startswith("raysim: metrics sink 'wandb' could not be created: ImportError")
    assert lines[0].endswith("training goes on with console, and parquet in its place (metrics/): the records are kept")
    assert len(read_metrics(open_storage(tmp_path / "run"))) == summary.iterations == 6
