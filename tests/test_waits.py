"""The driver's waits on Ray: a signal is handled within a slice of the wait, and every wait has a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    environ = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSIM_FAULT_AT")}
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGINT, False, 130), (signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
    ids=["SIGINT-driver", "ctrl-c-process-group", "SIGTERM-driver"],
)
def test_a_signal_during_a_long_final_evaluation_on_ray_stops_at_once_with_the_resume_hint(
    tmp_path, signum, to_group, code
):
    run_dir = tmp_path / "run"
    driver = start_train(run_dir, LONG_FINAL_EVAL)
    try:
        before = read_until(driver, "raysim: saved iteration 2")
        assert "saved iteration 2" in before, before[-3000:]
        time.sleep(3)  # the driver waits in Ray for the evaluation shard's 3,000 episodes now
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
    assert (run_dir / "checkpoints" / "2").is_dir()
