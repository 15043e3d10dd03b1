"""Run storage on an object store: a real S3 server on localhost (moto's server mode), pyarrow's S3 filesystem.

Train into ``s3://...``, kill the driver, resume from the bucket, evaluate, export and plot from it:
the checkpoints stay verifiable there (their completion marker written last, no rename), the config
snapshot and the task's resources travel through the bucket, the metrics are written in parts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.checkpoint import Checkpoints
from raysim.cli import main
from raysim.records import read_metrics
from raysim.storage import open_storage
from tests.support.moto_s3 import moto_server

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "--set",
    "env.num_envs=4",
    "--set",
    "algo.num_steps=32",
    "--set",
    "algo.num_minibatches=2",
    "--set",
    "train.total_steps=768",
    "--set",
    "train.log_every=1",
    "--set",
    "eval.every=2",
    "--set",
    "eval.episodes=4",
    "--set",
    "eval.num_envs=2",
    "--set",
    "env.kwargs.initial_states={generate: 16, seed: 3}",
]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 endpoint on localhost with a bucket ``raysim-test``; the variables every client needs."""
    pytest.importorskip("moto", reason="moto[server] is in the test extra: pip install -e '.[test]'")
    from pyarrow import fs

    with moto_server() as (port, env):
        bucket = fs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        bucket.create_dir("raysim-test")
        yield env


def killed_train(env: dict, cwd: Path, uri: str) -> subprocess.CompletedProcess:
    """``raysim train`` into ``uri`` in its own process, killed (SIGKILL) during the update of iteration 5."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ.update(env, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    command = ["-m", "tests.support.faulty_train", "update:5:kill", "train", "--local", "--run-dir", uri, *TINY]
    return subprocess.run([sys.executable, *command], cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_run_on_s3_survives_a_killed_driver_and_is_resumed_evaluated_exported_and_plotted_from_the_bucket(
    s3, tmp_path, monkeypatch, capsys
):
    uri = "s3://raysim-test/runs/cartpole"
    killed = killed_train(s3, tmp_path, uri)
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert not any(tmp_path.iterdir()), killed.stdout[-3000:] + killed.stderr[-3000:]  # nothing written locally
    assert "metrics sink" not in killed.stderr, killed.stderr[-3000:]
    for key, value in s3.items():  # the commands after the kill run in this process (main(argv)), from tmp_path
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    storage = open_storage(uri)
    checkpoint, state, meta = Checkpoints(storage).newest_intact(announce=False)
    assert checkpoint.iteration == 4 and meta["env_steps"] == 4 * 128  # evaluated iteration 4 was saved
    assert storage.exists("configs/gym.yaml") and storage.exists("resources/initial_states.npy")
    assert [r["iteration"] for r in read_metrics(storage)][:4] == [1, 2, 3, 4]  # written before checkpoint 4

    assert main(["resume", uri, "--local"]) == 0
    resumed = capsys.readouterr().out
    assert "(iteration 4," in resumed and "no longer exists" in resumed  # the dead driver's lock
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3, 4, 5, 6]  # each log step once
    assert Checkpoints(storage).newest_intact(announce=False)[0].iteration == 6
    assert not storage.exists("lock.json")

    assert main(["eval", uri, "--episodes", "4", "--local", "--out", str(tmp_path / "e.parquet")]) == 0
    assert "completed c / n        4/4" in capsys.readouterr().out
    assert main(["export", uri, "--out", str(tmp_path / "policy.pt")]) == 0
    assert (tmp_path / "policy.pt").stat().st_size > 0
    assert main(["plot", uri]) == 0
    assert storage.read("plots.png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.parquet", "policy.pt"]


def test_a_checkpoint_on_s3_without_its_marker_is_incomplete_and_skipped(s3, monkeypatch):
    import torch

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    checkpoints = Checkpoints(open_storage("s3://raysim-test/marker"))
    checkpoints.save(1, {"version": 1, "w": torch.ones(3)}, {})

    class Killed(BaseException):
        pass

    def killed() -> None:
        raise Killed

    with pytest.raises(Killed):
        checkpoints.save(2, {"version": 2, "w": torch.ones(3)}, {}, before_marker=killed)
    checkpoint, state, _ = checkpoints.newest_intact(announce=False)
    assert checkpoint.iteration == 1 and state["version"] == 1


def test_a_checkpoint_on_s3_is_retired_by_deleting_its_marker_first(s3, monkeypatch):
    import torch

    from raysim.storage import FsStorage

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    storage = open_storage("s3://raysim-test/retire")
    checkpoints = Checkpoints(storage)
    for iteration in (1, 2, 3):
        checkpoints.save(iteration, {"version": iteration, "w": torch.ones(3)}, {})

    class Killed(BaseException):
        pass

    real = FsStorage.remove

    def killed_after_the_markers(self, rel: str) -> None:
        if not rel.endswith("manifest.json"):
            raise Killed
        real(self, rel)

    monkeypatch.setattr(FsStorage, "remove", killed_after_the_markers)
    with pytest.raises(Killed):  # the process dies after the markers went, before the rest
        checkpoints.retire_after(1)
    monkeypatch.setattr(FsStorage, "remove", real)
    checkpoint, state, _ = checkpoints.newest_intact(announce=False)
    assert checkpoint.iteration == 1 and state["version"] == 1  # no abandoned checkpoint is intact
    checkpoints.retire_after(1)
    assert [c.name for c in checkpoints.list()] == ["1"]


def test_a_checkpoint_directory_on_s3_given_with_query_options_last_is_recognised(s3, monkeypatch):
    import torch

    from raysim.checkpoint import locate_checkpoint, split_checkpoint

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    Checkpoints(open_storage("s3://raysim-test/query")).save(3, {"w": torch.ones(3)}, {})
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint only in the URI's query, last
    endpoint = s3["AWS_ENDPOINT_URL"].removeprefix("http://")
    options = f"endpoint_override={endpoint}&scheme=http"
    assert split_checkpoint(f"s3://raysim-test/query/checkpoints/3?{options}")[0] == f"s3://raysim-test/query?{options}"
    storage, checkpoint, state, _ = locate_checkpoint(f"s3://raysim-test/query/checkpoints/3?{options}")
    assert checkpoint.name == "3" and torch.equal(state["w"], torch.ones(3))
    endpoint_url = f"endpoint_url=http://{endpoint}"  # a query value with slashes in it
    assert split_checkpoint(f"s3://raysim-test/query/checkpoints/3/?{endpoint_url}")[1].name == "3"


def test_a_new_run_starts_from_a_run_in_the_bucket_with_model_init_from(s3, tmp_path, monkeypatch, capsys):
    import torch

    from raysim.checkpoint import locate_checkpoint

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    uri = "s3://raysim-test/runs/source"
    assert main(["train", "--local", "--run-dir", uri, *TINY, "--set", "eval.every=0"]) == 0
    tuned = tmp_path / "tuned"
    short = ["--set", "train.total_steps=128", "--set", f"model.init_from={uri}", "--set", "algo.lr=1e-12"]
    assert main(["train", "--local", "--run-dir", str(tuned), *TINY, *short]) == 0
    assert f"model.init_from: starting from {uri}" in capsys.readouterr().out
    source, started = locate_checkpoint(uri)[2]["model"], locate_checkpoint(tuned)[2]["model"]
    assert all(torch.allclose(source[k], started[k]) for k in source if k.startswith("actor.net"))


def test_a_run_directory_in_a_bucket_that_does_not_exist_is_one_line_naming_the_bucket(
    s3, tmp_path, monkeypatch, capsys
):
    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--local", "--run-dir", "s3://no-such-bucket/runs/x", *TINY]) == 2
    error = capsys.readouterr().err
    assert "its bucket 'no-such-bucket' does not exist" in error and "internal error" not in error
    assert len(error.strip().splitlines()) == 1, error


def test_a_sweeps_tune_state_cut_short_in_the_bucket_is_mended_from_the_drivers_local_staging_copy(
    s3, tmp_path, monkeypatch
):
    """An experiment directory on S3 (nodes sharing no filesystem); Ray's staging copy on the driver's machine.
    The local cases and the refusal: tests/test_tune_state.py."""
    import json

    from raysim.sweep.tune_state import mend

    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    name = "experiment_state-2026-12-06_23-30-21.json"
    whole = json.dumps({"trial_data": [["a", "b"]]}).encode()
    storage = open_storage("s3://raysim-test/sweeps/asha")
    storage.write(name, b"")
    staging = tmp_path / "session_1" / "artifacts" / "2026-12-06_23-30-20" / "asha" / "driver_artifacts"
    staging.mkdir(parents=True)
    (staging / name).write_bytes(whole)
    assert mend(storage, tmp_path) == [name]
    assert open_storage("s3://raysim-test/sweeps/asha").read(name) == whole
