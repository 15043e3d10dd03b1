"""Autoscaling: a run asking for more shard resources than the head has makes Ray's (fake) autoscaler
add worker nodes, and the run grows onto them (run in its own process: tests/support/autoscaling.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_autoscaler_adds_shard_nodes_and_the_run_uses_them(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    environ["RAY_AUTH_MODE"] = "disabled"  # the test cluster's head runs without token authentication
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.autoscaling", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        timeout=480,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["shard_nodes"] == 3  # the head has no "shard" resource: every shard node was autoscaled
    assert outcome["shards"] == 3 and len(set(outcome["shard_placement"])) == 3
    assert "elastic: added" in result.stdout
    assert outcome["env_steps"] >= 12800
