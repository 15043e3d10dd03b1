"""Short resources: a run that cannot fit says so within seconds, with the numbers; nothing waits silently.

Against a real ``ray start --head`` with 2 CPUs on free ports (its own temp dir and token), in subprocesses:
the driver attaches to that head, not to the test session's Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysim.cli import main
from tests.support.ray_head import RayHead

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "--set",
    "env.num_envs=4",
    "--set",
    "algo.num_steps=32",
    "--set",
    "algo.num_minibatches=2",
    "--set",
    "train.total_steps=256",
    "--set",
    "eval.episodes=2",
    "--set",
    "eval.num_envs=2",
]


@pytest.fixture(scope="module")
def head():
    with RayHead(num_cpus=2, grace=0.5) as started:  # thrown away: its GCS and raylet need not end gracefully
        yield started


def raysim(args: list[str], env: dict, cwd: Path, timeout: int = 240) -> tuple[subprocess.CompletedProcess, float]:
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "raysim", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done, time.monotonic() - start


@pytest.mark.slow  # a head of its own (the module's)
def test_a_run_too_big_for_a_cluster_that_cannot_grow_fails_at_once_with_the_numbers(head, tmp_path):
    done, seconds = raysim(["train", "--address", head.address, *TINY], head.env, tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    err = done.stderr
    assert "this run needs 3 CPU and the cluster has 2 CPU" in err and "no autoscaler to add more" in err
    assert "learner ranks: 1 x (1 CPU)" in err and "shards.num_cpus" in err and "Traceback" not in err
    assert seconds < 60 and not any(tmp_path.iterdir())  # no run directory for a run that never started


@pytest.mark.slow
def test_plain_raysim_train_attaches_to_the_cluster_running_on_this_machine_and_the_lowered_run_fits(head, tmp_path):
    # one run for two claims (each run attaches and starts its roles: seconds): the run refused above, its roles
    # lowered, trains to its end on the same head, which plain `raysim train` (no --address) found and attached to
    lower = ["--set", "shards.num_cpus=0.5", "--set", "learner.num_cpus=0.5", "--run-dir", str(tmp_path / "run")]
    done, _ = raysim(["train", *TINY, *lower], head.env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "done: 256 env steps" in done.stdout
    assert "attaching to the Ray cluster running on this machine at " in done.stdout
    assert f":{head.port} (--address local starts an embedded one instead)" in done.stdout


@pytest.mark.slow
def test_address_local_starts_an_embedded_ray_beside_a_running_cluster_with_room_for_every_learner_rank(head, tmp_path):
    # one embedded Ray for two claims: beside the running 2-CPU head (which it must not attach to: 5 CPUs are
    # asked for), sized for 2 shards, an evaluation shard and 2 learner ranks of 1 CPU each
    ranks = ["--set", "learner.ranks=2", "--set", "shards.count=2", "--run-dir", str(tmp_path / "run")]
    done, _ = raysim(["train", "--address", "local", *TINY, *ranks], head.env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "attaching" not in done.stdout
    kept = [log.read_text() for log in Path(head.base).rglob("raysim-driver.log")]  # Ray's messages: its session logs
    assert any("Started a local Ray instance" in text for text in kept), kept


def test_an_unreachable_address_is_an_error_within_seconds(tmp_path, capsys, monkeypatch, ray_never_starts):
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    code = main(["train", "--address", "127.0.0.1:1", *TINY])
    seconds, err = time.monotonic() - start, capsys.readouterr().err
    assert code == 2 and "no Ray cluster answers at 127.0.0.1:1" in err, err
    assert seconds < 30 and len(err.strip().splitlines()) <= 2 and not ray_never_starts


def test_a_job_submission_address_given_to_attach_is_explained(tmp_path, capsys, monkeypatch, ray_never_starts):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    code, err = main(["train", *TINY]), capsys.readouterr().err
    assert code == 2 and "is a dashboard / job-submission address" in err, err
    assert "ray job submit" in err and "Traceback" not in err and not ray_never_starts


@pytest.mark.slow
def test_attaching_to_a_token_cluster_without_the_token_says_what_to_set(head, tmp_path):
    env = {k: v for k, v in head.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    # ray.init asks the GCS for the cluster id 20 times, 1 s apart, before it gives up (the same refusal each time)
    env["RAY_NUM_REDIS_GET_RETRIES"] = "1"
    done, _ = raysim(["train", "--address", head.address, *TINY], env, tmp_path, timeout=180)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "requires token authentication: set RAY_AUTH_MODE=token" in done.stderr and "Traceback" not in done.stderr


def test_rays_own_messages_go_to_its_log_directory_not_the_console(tmp_path, monkeypatch, capfd):
    import io
    import logging

    import ray
    from ray._private import worker

    import raysim
    from raysim.coordinator import cluster

    def init(**kwargs):  # what an embedded start says
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
            "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."
        )
        logging.getLogger("ray._private.worker").info("Started a local Ray instance.")

    console = io.StringIO()  # where the ``ray`` logger writes (Ray's handler keeps the stderr it was made with)
    monkeypatch.setattr(logging.getLogger("ray"), "handlers", [logging.StreamHandler(console)])
    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(cluster, "ray_logs_dir", lambda: str(tmp_path), raising=False)
    capfd.readouterr()
    assert cluster.connect(raysim.load_config(None), "local")  # an embedded start
    died = "A worker died or was killed while executing a task by an unexpected system error."
    worker.print_to_stdstream({"lines": [died], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    out, err = capfd.readouterr()
    assert out + err + console.getvalue() == "", out + err + console.getvalue()  # raysim's own lines only
    kept = (tmp_path / "raysim-driver.log").read_text()
    assert "Token authentication is enabled" in kept and "Started a local Ray instance" in kept, kept
    assert f"(raylet) {died}" in kept, kept
    cluster.stop_ray()
    logging.getLogger("ray.util").warning("after the run")
    assert console.getvalue() == "after the run\n"  # Ray's messages reach the console again once it stopped
