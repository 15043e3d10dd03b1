"""Multi-node: a simulated cluster of several Ray nodes on this machine (each run in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PER_ITERATION = 4 * 32  # rows x steps, per shard


def run_cluster(mode: str, run_dir: Path, *extra: str) -> tuple[dict, str]:
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.multinode", mode, str(run_dir), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stdout


@pytest.mark.slow
def test_shards_spread_over_nodes_and_a_lost_node_keeps_training_with_exact_batches(tmp_path):
    outcome, out = run_cluster("remove", tmp_path / "run")
    assert len(set(outcome["placement"])) >= 2  # the 4 shards ran on several worker nodes
    assert "fault: shard" in out  # the shards of the removed node were replaced...
    assert outcome["iterations"] == 8 and outcome["env_steps"] == 8 * 4 * PER_ITERATION
    steps = outcome["steps"]  # ...and every iteration still collected exactly one chunk per shard
    assert steps == [4 * PER_ITERATION * (i + 1) for i in range(8)]
    assert outcome["removed"] in outcome["placement"] and outcome["removed"] not in outcome["final_placement"]


@pytest.mark.slow
def test_elastic_shards_grow_when_a_node_joins(tmp_path):
    outcome, out = run_cluster("grow", tmp_path / "run")
    assert "elastic: added 2 shard(s)" in out
    increments = [b - a for a, b in zip([0] + outcome["steps"], outcome["steps"], strict=False)]
    assert increments[:3] == [2 * PER_ITERATION] * 3 and increments[-1] == 4 * PER_ITERATION
    assert len(outcome["final_placement"]) == 4 and len(set(outcome["final_placement"])) == 2
    assert outcome["env_steps"] >= 4 * 8 * PER_ITERATION  # the run stops on its step budget


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_chunk_lost_with_its_node_before_the_learner_read_it_is_collected_again_by_a_replacement(tmp_path, ranks):
    outcome, out = run_cluster("lose_chunk", tmp_path / "run", str(ranks))
    # shard 0's chunk of iteration 3 finished before its node went, and the learner had not read it yet
    assert "shard 0 lost its chunk with its node before the learner read it (ChunksLost)" in out
    per_iteration = 2 * 16 * 512  # 2 shards x 16 rows x 512 steps
    assert outcome["steps"] == [per_iteration * (i + 1) for i in range(4)]  # every batch of its planned size
    assert outcome["iterations"] == 4 and outcome["env_steps"] == 4 * per_iteration
    assert outcome["removed"] == outcome["placement"][0] and outcome["removed"] not in outcome["final_placement"]
