"""Checkpoints: complete or not at all, content hashes verified, damage named and skipped, code never run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from raysim.checkpoint import Checkpoint, CheckpointError, Checkpoints, locate_checkpoint, sha256
from raysim.envs import make
from raysim.storage import LocalStorage, Staging
from raysim.storage.local import LocalStaging


def state(value: float) -> dict:
    return {"model": {"w": torch.full((64,), value)}, "version": int(value)}


def store(tmp_path) -> Checkpoints:
    return Checkpoints(LocalStorage(tmp_path))


def save(tmp_path, iteration: int, value: dict, meta: dict) -> Path:
    """Checkpoint ``iteration`` saved and pruned as a run saves it; its directory."""
    checkpoints = store(tmp_path)
    checkpoint = checkpoints.save(iteration, value, meta)
    checkpoints.prune(keep_last=3)
    return tmp_path / checkpoint.rel


def load(path) -> tuple[dict, dict]:
    """``(state, meta)`` of the checkpoint directory ``path``, as ``raysim eval`` and ``raysim export`` load it."""
    return locate_checkpoint(path)[2:]


def test_a_checkpoint_round_trips_and_carries_a_manifest_with_every_files_hash(tmp_path):
    path = save(tmp_path, 7, state(7.0), {"env_steps": 70})
    loaded, meta = load(path)
    assert torch.equal(loaded["model"]["w"], torch.full((64,), 7.0)) and loaded["version"] == 7
    assert meta["iteration"] == 7 and meta["env_steps"] == 70 and meta["checkpoint_format"] == 2
    assert {"torch", "ray", "gymnasium", "numpy", "python"} <= set(meta["versions"])
    manifest = json.loads((path / "manifest.json").read_text())["files"]
    assert set(manifest) == {"state.pt", "meta.json"}
    for name, entry in manifest.items():
        data = (path / name).read_bytes()
        assert entry == {"sha256": sha256(data), "bytes": len(data)}
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["7"]  # no pointer file, no leftovers


def test_a_failed_save_keeps_the_previous_checkpoint_and_leaves_no_partial_directory(tmp_path, monkeypatch):
    save(tmp_path, 1, state(1.0), {})
    real = LocalStaging.write

    def full_disk(self, name, data):
        if name == "state.pt":
            real(self, name, data[:100])
            raise OSError(28, "No space left on device")
        real(self, name, data)

    monkeypatch.setattr(LocalStaging, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save(tmp_path, 2, state(2.0), {})
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
    checkpoint, loaded, _ = store(tmp_path).newest_intact()
    assert checkpoint.name == "1" and loaded["version"] == 1


def damage(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


@pytest.mark.parametrize("how", ["truncated", "overwritten", "empty"])
def test_a_damaged_state_file_is_named_and_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys, how):
    save(tmp_path, 1, state(1.0), {})
    save(tmp_path, 2, state(2.0), {})
    target = tmp_path / "checkpoints" / "2" / "state.pt"
    size = target.stat().st_size
    if how == "truncated":
        target.write_bytes(target.read_bytes()[:50])
    elif how == "overwritten":  # 512 bytes inside a weight tensor: the zip still opens, the values are wrong
        damage(target, size // 2, b"\x41" * 512)
        assert target.stat().st_size == size
    else:
        target.write_bytes(b"")
    with pytest.raises(
        CheckpointError, match=rf"checkpoint file {target} is damaged: .* does not match the content hash"
    ):
        load(target.parent)
    checkpoint, loaded, _ = store(tmp_path).newest_intact()
    assert checkpoint.name == "1" and loaded["version"] == 1
    out = capsys.readouterr().out
    assert f"skipping damaged checkpoint: checkpoint file {target} is damaged" in out and "falling back" in out


def legacy(tmp_path, iteration: int, state_bytes: bytes) -> str:
    """A checkpoint as raysim wrote them before manifests: state.pt and meta.json, nothing else."""
    folder = tmp_path / "checkpoints" / str(iteration)
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(state_bytes)
    (folder / "meta.json").write_text(json.dumps({"iteration": iteration, "env_steps": 10}))
    return str(folder)


def torch_bytes(value) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_checkpoints_from_before_hashes_load_as_unverified_said_once(tmp_path, capsys):
    folder = legacy(tmp_path, 3, torch_bytes(state(3.0)))
    for _ in range(2):
        loaded, meta = load(folder)
        assert loaded["version"] == 3 and meta["iteration"] == 3
    out = capsys.readouterr().out
    assert out.count("predates content hashes: loaded unverified") == 1


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"", "it is empty (0 bytes)"),
        (os.urandom(4096), "it is not a complete torch checkpoint file"),
        (None, "it carries pickled objects"),
    ],
)
def test_an_unreadable_state_file_says_what_is_wrong_with_it(tmp_path, content, cause):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    folder = legacy(tmp_path, 1, torch_bytes({"model": Exploit()}) if content is None else content)
    with pytest.raises(CheckpointError, match=re.escape(f"{folder}/state.pt cannot be loaded: {cause}")):
        load(folder)


def test_a_forged_checkpoint_whose_manifest_matches_a_pickled_object_is_still_refused(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = save(tmp_path, 1, state(1.0), {})
    evil = torch_bytes({"model": Exploit()})
    (path / "state.pt").write_bytes(evil)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["state.pt"] = {"sha256": sha256(evil), "bytes": len(evil)}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="pickled objects"):
        load(path)


def test_a_save_killed_before_its_marker_is_incomplete_skipped_and_cleaned_up(tmp_path, capsys):
    save(tmp_path, 1, state(1.0), {})
    checkpoints = store(tmp_path)

    class Killed(BaseException):
        pass

    def kill():
        raise Killed

    with pytest.raises(Killed):  # the staging directory is abandoned
        checkpoints.save(2, state(2.0), {}, before_marker=kill)
    # a save on a filesystem without rename (object stores) leaves the files but no marker
    folder = tmp_path / "checkpoints" / "3"
    folder.mkdir()
    (folder / "state.pt").write_bytes(torch_bytes(state(3.0)))
    (folder / "meta.json").write_text(json.dumps({"iteration": 3, "checkpoint_format": 2}))
    (tmp_path / "checkpoints" / f"{Staging.PREFIX}4-12345").mkdir()  # a killed process's staging directory
    checkpoint, loaded, _ = checkpoints.newest_intact()
    assert checkpoint.iteration == 1 and loaded["version"] == 1
    assert (
        "checkpoints/3 is incomplete (its save was cut short): its manifest.json is missing" in capsys.readouterr().out
    )
    checkpoints.save(5, state(5.0), {})
    checkpoints.prune(keep_last=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "5"]


def test_saving_an_iteration_again_replaces_it_only_once_the_new_one_is_complete(tmp_path):
    checkpoints = store(tmp_path)
    checkpoints.save(4, state(4.0), {})
    with pytest.raises(RuntimeError, match="cut"):
        checkpoints.save(4, state(40.0), {}, before_marker=lambda: (_ for _ in ()).throw(RuntimeError("cut")))
    assert [c.name for c in checkpoints.list()] == ["4"] and checkpoints.load(checkpoints.list()[0])[0]["version"] == 4
    again = checkpoints.save(4, state(40.0), {})
    assert again == Checkpoint(4, 1, "4.1") and [c.name for c in checkpoints.list()] == ["4.1"]
    assert checkpoints.newest_intact()[1]["version"] == 40


def test_a_checkpoint_missing_its_meta_is_reported_as_incomplete(tmp_path):
    path = save(tmp_path, 3, state(3.0), {})
    os.remove(path / "meta.json")
    with pytest.raises(CheckpointError, match="incomplete: .*meta.json is missing"):
        load(path)


def test_pruning_keeps_the_newest_and_the_best_scored_checkpoint_and_scores_only_their_own_evaluation(tmp_path):
    checkpoints = store(tmp_path)
    for iteration, score in [(1, 10.0), (2, 500.0), (3, None), (4, 30.0), (5, None)]:
        checkpoint = checkpoints.save(iteration, state(float(iteration)), {})
        checkpoints.record_score(checkpoint, score)
        checkpoints.prune(keep_last=2)
    assert [c.name for c in checkpoints.list()] == ["2", "4", "5"]
    assert [checkpoints.score(c) for c in checkpoints.list()] == [500.0, 30.0, None]


def test_the_rename_and_the_checkpoint_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    import raysim.storage.local

    real = raysim.storage.local.fsync_dir
    monkeypatch.setattr(raysim.storage.local, "fsync_dir", lambda path: (synced.append(str(path)), real(path)))
    path = save(tmp_path, 1, state(1.0), {})
    staged = [s for s in synced if os.path.basename(s).startswith(f"{Staging.PREFIX}1-")]
    assert staged and synced.index(staged[0]) < synced.index(str(path.parent))  # the files, then the rename


def test_a_full_disk_fails_the_save_with_the_previous_checkpoint_intact(small_disk):
    save(small_disk, 1, state(1.0), {})
    (small_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))  # leave less than a checkpoint
    big = {"model": {"w": torch.zeros(64 * 1024)}, "version": 2}  # 256 KiB
    with pytest.raises(OSError) as error:
        save(small_disk, 2, big, {})
    assert error.value.errno == 28  # ENOSPC
    assert error.value.filename.startswith(f"{small_disk}/checkpoints/2/")  # which write failed
    assert sorted(os.listdir(small_disk / "checkpoints")) == ["1"]
    assert store(small_disk).newest_intact()[1]["version"] == 1


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


def test_pruning_keeps_the_abandoned_timelines_of_the_newest_retirements_only(tmp_path, capsys):
    """Three rewinds to iteration 3 within a second each retire 5, 7 and 9 (rewinds, PBT exploits): pruning keeps
    the two newest retirements' checkpoints under abandoned/ by default, none with keep_abandoned 0."""
    checkpoints = store(tmp_path)
    checkpoints.save(3, state(3.0), {})
    for _ in range(3):
        for iteration in (5, 7, 9):
            checkpoints.save(iteration, state(float(iteration)), {})
        checkpoints.retire_after(3)
    folder = tmp_path / "checkpoints" / "abandoned"
    assert len(list(folder.iterdir())) == 9
    checkpoints.prune(keep_last=1)
    kept = sorted(p.name for p in folder.iterdir())
    assert len(kept) == 6 and len({name.rpartition("-")[0] for name in kept}) == 2  # two retirements, 3 each
    checkpoints.save(5, state(5.0), {})
    checkpoints.retire_after(3)  # a fourth: the oldest of the two kept goes at the next save
    checkpoints.prune(keep_last=1)
    assert sorted(p.name for p in folder.iterdir())[:3] == kept[3:] and len(list(folder.iterdir())) == 4
    checkpoints.prune(keep_last=1, keep_abandoned=0)
    assert list(folder.iterdir()) == [] and [c.name for c in checkpoints.list()] == ["3"]
