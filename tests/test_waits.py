"""The driver's waits on Ray: a signal is handled within a slice of the wait, and every wait has a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

import raysim
from raysim.actors import RayBackend
from raysim.checkpoint import Checkpoints
from raysim.coordinator import Trainer
from raysim.coordinator.signals import StopRequested, StopSignals
from raysim.coordinator.trainer import RunFailed
from raysim.storage import LocalStorage, RunLock, RunLockedError, open_storage
from raysim.sweep.trial import wait_for_handover

ROOT = Path(__file__).resolve().parent.parent
# 1 shard x 4 rows x 32 steps, 2 iterations; then a final evaluation of 3,000 episodes on one row (minutes)
LONG_FINAL_EVAL = [
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=256",
    "train.log_every=1",
    "eval.episodes=3000",
    "eval.num_envs=1",
    "train.sinks=[parquet]",
]


def start_train(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """``raysim train`` on an embedded Ray, in its own process group (as a shell runs a command)."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    sets = [item for override in overrides for item in ("--set", override)]
    command = [sys.executable, "-m", "raysim", "train", "--run-dir", str(run_dir), "--address", "local", *sets]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until(process: subprocess.Popen, text: str) -> str:
    """The process's output up to the first line containing ``text`` (all of it, if it ended first)."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if text in line:
            break
    return "".join(seen)


@ray.remote(num_cpus=0)
def finishes_after(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_driver_waits_in_ray_ends_the_wait_at_once(ray_session, signum):
    backend = RayBackend()
    slow = finishes_after.remote(60)  # what the driver waits for: never ready before the signal
    threading.Timer(1.0, os.kill, [os.getpid(), signum]).start()
    with StopSignals(), pytest.raises(StopRequested) as stopped:
        backend.get([slow])
    assert stopped.value.signum == signum
    assert not ray.wait([slow], timeout=0)[0]  # the wait ended before what it waited for
    ray.cancel(slow, force=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
    ids=["ctrl-c-process-group", "SIGTERM-driver"],
)  # SIGINT to the driver alone: as Ctrl-C's path in the driver (every phase locally: tests/test_crash_safety.py;
# a wait in Ray ended at once: the test above), without the signal reaching Ray's own processes too
def test_a_signal_during_a_long_final_evaluation_on_ray_stops_at_once_with_the_resume_hint(
    tmp_path, signum, to_group, code
):
    run_dir = tmp_path / "run"
    driver = start_train(run_dir, LONG_FINAL_EVAL)
    try:
        before = read_until(driver, "raysim: saved iteration 2")
        assert "saved iteration 2" in before, before[-3000:]
        time.sleep(1)  # the final save printed that line; the driver waits in Ray for the 3,000 episodes now
        if to_group:  # Ctrl-C in a terminal: the driver and every process it started
            os.killpg(driver.pid, signum)
        else:
            driver.send_signal(signum)
        after, _ = driver.communicate(timeout=120)  # the evaluation alone takes minutes on this machine
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = before + after
    assert driver.returncode == code, out[-3000:]
    assert "during the final evaluation: it was not finished" in out
    assert f"continue with `raysim resume {run_dir}`" in out
    assert "internal error" not in out and "Traceback" not in out
    # every iteration kept: the newest intact checkpoint is the last one (Ctrl-C or SIGTERM on an embedded Ray)
    assert Checkpoints(LocalStorage(run_dir)).newest_intact(announce=False)[0].iteration == 2


# -- every wait has a deadline -------------------------------------------------------------------

# 2 shards x 4 rows x 32 steps, 6 iterations, no evaluation: 2 shards and the learner take 3 of the session's 4 CPUs
ROOMY = [
    "backend=ray",
    "shards.count=2",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=1536",
    "train.log_every=1",
    "eval.episodes=0",
    "checkpoint.every=100",
    "resources_timeout=120",  # to start (a worker process starts in seconds here); 6 s for a replacement
    "train.sinks=[]",
]


@ray.remote(num_cpus=2)
class Blocker:
    """Another job on the cluster: it takes the CPUs a lost role leaves."""

    def ping(self) -> bool:
        return True


class TakeTheRoomOf:
    """A sink that, at iteration 2, kills a role and lets another job take its CPUs (and the one left free).

    A safety valve for the code before the fix, which waits for ever: the job ends after ``release`` seconds.
    """

    def __init__(self, trainer: Trainer, role: str, release: float = 60.0):
        self.trainer, self.role, self.release = trainer, role, release
        self.blocker, self.timer = None, None

    def write(self, record: dict) -> None:
        if record["iteration"] != 2:
            return
        roles = self.trainer.session.roles
        self.trainer.config.resources_timeout = 6.0
        for handle in roles.learner.handles if self.role == "learner" else roles.shards[:1]:
            ray.kill(handle.actor)
        self.blocker = Blocker.remote()
        ray.get(self.blocker.ping.remote())  # it started: the role's replacement has no room now
        self.timer = threading.Timer(self.release, ray.kill, [self.blocker])
        self.timer.start()

    def close(self) -> None:
        pass

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            ray.kill(self.blocker)


@pytest.mark.slow
@pytest.mark.parametrize(("role", "waits_for"), [("shard", "replacement for shard 0"), ("learner", "learner rank")])
def test_a_lost_role_without_room_for_its_replacement_ends_the_run_after_resources_timeout_saved(
    ray_session, tmp_path, capsys, role, waits_for
):
    config = raysim.load_config(None, [*ROOMY, f"run_dir={tmp_path / 'run'}"])
    trainer = Trainer(config)
    sink = TakeTheRoomOf(trainer, role)
    trainer.sinks = [sink]
    try:
        with pytest.raises(RunFailed) as failed:
            trainer.train()
    finally:
        sink.end()
    message = str(failed.value)
    assert "did not start in 6 s (resources_timeout)" in message and waits_for in message, message
    assert f"the last completed iteration (2) is saved; after fixing the cause: raysim resume {tmp_path / 'run'}" in (
        message
    )
    assert f"raysim: waiting for 1 of 1 {waits_for}" in capsys.readouterr().out  # every few seconds meanwhile
    assert Checkpoints(LocalStorage(tmp_path / "run")).newest_intact(announce=False)[0].iteration == 2


@pytest.mark.slow
def test_a_trial_whose_earlier_attempt_never_hands_over_is_refused_and_its_run_directory_kept(tmp_path, capsys):
    storage = open_storage(tmp_path / "trial")
    earlier = RunLock(storage)  # a live process (this one) still holds the trial's run directory
    earlier.acquire()
    storage.write("metrics/part-0.parquet", b"rows of the earlier attempt")
    try:
        with pytest.raises(RunLockedError, match=r"still held by process \d+ on host .* after 6 s \(resources_timeout"):
            wait_for_handover(RunLock(storage), timeout=6)
    finally:
        earlier.release()
    assert "raysim: waiting for process" in capsys.readouterr().out  # every few seconds meanwhile
    assert storage.read("metrics/part-0.parquet") == b"rows of the earlier attempt"
