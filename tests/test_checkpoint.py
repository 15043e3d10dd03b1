"""Checkpoints: atomic, code-free loading, damage fallback, pruning; env state round trips."""

from __future__ import annotations

import json
import os

import pytest
import torch

from raysim.checkpoint import CheckpointError, load_checkpoint, load_latest, save_checkpoint
from raysim.envs import make


def state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "version": int(value)}


def test_a_checkpoint_round_trips_tensors_plain_data_and_versions(tmp_path):
    path = save_checkpoint(tmp_path, 7, state(7.0), {"env_steps": 70})
    loaded, meta = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.full((3,), 7.0)) and loaded["version"] == 7
    assert meta["iteration"] == 7 and meta["env_steps"] == 70
    assert {"torch", "ray", "gymnasium", "numpy", "python"} <= set(meta["versions"])
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "7"


def test_no_temporary_directory_is_left_and_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, state(1.0), {})

    def broken_save(obj, file):
        with open(file, "wb") as handle:
            handle.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, state(2.0), {})
    monkeypatch.undo()
    assert not (tmp_path / "checkpoints" / "2").exists()
    path, loaded, _ = load_latest(tmp_path)
    assert path.name == "1" and loaded["version"] == 1


def test_a_truncated_checkpoint_names_the_file_and_resume_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    save_checkpoint(tmp_path, 1, state(1.0), {})
    save_checkpoint(tmp_path, 2, state(2.0), {})
    target = tmp_path / "checkpoints" / "2" / "state.pt"
    target.write_bytes(target.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=str(target)):
        load_checkpoint(target.parent)
    path, loaded, _ = load_latest(tmp_path)
    assert path.name == "1" and loaded["version"] == 1
    out = capsys.readouterr().out
    assert "skipping damaged checkpoint" in out and "falling back" in out


def test_a_checkpoint_missing_its_meta_is_reported_as_incomplete(tmp_path):
    path = save_checkpoint(tmp_path, 3, state(3.0), {})
    os.remove(path / "meta.json")
    with pytest.raises(CheckpointError, match="incomplete: .*meta.json is missing"):
        load_checkpoint(path)


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_checkpoint_carrying_a_pickled_object_that_would_run_code_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, 1, state(1.0), {})
    torch.save({"model": Exploit()}, path / "state.pt")
    with pytest.raises(CheckpointError, match="pickled objects"):
        load_checkpoint(path)


def test_old_checkpoints_are_pruned_but_the_best_evaluated_one_is_kept(tmp_path):
    for step, score in [(1, 10.0), (2, 500.0), (3, 20.0), (4, 30.0), (5, 40.0)]:
        save_checkpoint(tmp_path, step, state(float(step)), {"eval_return": score}, keep_last=2)
    kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == [2, 4, 5]
    assert json.loads((tmp_path / "checkpoints" / "2" / "meta.json").read_text())["eval_return"] == 500.0


def test_env_state_round_trips_so_that_episodes_continue_exactly():
    env = make("raysim/CartPole", 8, seed=3)
    actions = torch.randint(0, 2, (40, 8), generator=torch.Generator().manual_seed(0))
    for t in range(20):
        env.step(actions[t])
    saved = env.get_state()
    expected = [env.step(actions[t]) for t in range(20, 40)]
    other = make("raysim/CartPole", 8, seed=99)
    other.set_state(saved)
    for t, step in zip(range(20, 40), expected, strict=True):
        again = other.step(actions[t])
        assert torch.equal(again.obs["policy"], step.obs["policy"])
        assert torch.equal(again.done_rows, step.done_rows)
    with pytest.raises(ValueError, match="rows"):
        make("raysim/CartPole", 4).set_state(saved)
