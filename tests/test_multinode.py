"""Multi-node: a simulated cluster of several Ray nodes on this machine (one process runs every scenario of the
tests selected, each a run of its own, on one cluster: see tests/support/multinode.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PER_ITERATION = 4 * 32  # rows x steps, per shard


def scenario(name: str):
    """The cluster scenario a test checks (``{ranks}``: filled from the test's parameters)."""

    def mark(test):
        test.scenario = name
        return test

    return mark


def run_cluster(run_root: Path, scenarios: list[str]) -> dict[str, tuple[dict, str]]:
    """Each scenario's outcome and the output of its run (every scenario in one process, on one cluster)."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.multinode", str(run_root), *scenarios],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        timeout=240 + 180 * len(scenarios),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found, name, lines = {}, None, []
    for line in result.stdout.splitlines():
        if line.startswith("SCENARIO "):
            name, lines = line.split()[1], []
        elif line.startswith("OUTCOME ") and name:
            found[name] = (json.loads(line.split(" ", 1)[1]), "\n".join(lines))
        else:
            lines.append(line)
    assert set(found) == set(scenarios), result.stdout[-3000:] + result.stderr[-3000:]
    return found


@pytest.fixture(scope="module")
def cluster_runs(request, tmp_path_factory):
    """The scenarios of this module's selected tests, run once."""
    wanted = []
    for item in request.session.items:
        test = getattr(item, "function", None)
        if item.module is request.module and hasattr(test, "scenario"):
            params = item.callspec.params if hasattr(item, "callspec") else {}
            wanted.append(test.scenario.format(**params))
    return run_cluster(tmp_path_factory.mktemp("multinode"), sorted(set(wanted), key=wanted.index))


def outcome_of(cluster_runs: dict, name: str) -> tuple[dict, str]:
    outcome, out = cluster_runs[name]
    assert "error" not in outcome, outcome.get("error", "") + out[-3000:]
    return outcome, out


@pytest.mark.slow
@scenario("remove")
def test_shards_spread_over_nodes_and_a_lost_node_keeps_training_with_exact_batches(cluster_runs):
    outcome, out = outcome_of(cluster_runs, "remove")
    assert len(set(outcome["placement"])) >= 2  # the 4 shards ran on several worker nodes
    assert "fault: shard" in out  # the shards of the removed node were replaced...
    assert outcome["iterations"] == 8 and outcome["env_steps"] == 8 * 4 * PER_ITERATION
    steps = outcome["steps"]  # ...and every iteration still collected exactly one chunk per shard
    assert steps == [4 * PER_ITERATION * (i + 1) for i in range(8)]
    assert outcome["removed"] in outcome["placement"] and outcome["removed"] not in outcome["final_placement"]


@pytest.mark.slow
@scenario("grow")
def test_elastic_shards_grow_when_a_node_joins(cluster_runs):
    outcome, out = outcome_of(cluster_runs, "grow")
    assert "elastic: added 2 shard(s)" in out
    increments = [b - a for a, b in zip([0] + outcome["steps"], outcome["steps"], strict=False)]
    assert increments[:3] == [2 * PER_ITERATION] * 3 and increments[-1] == 4 * PER_ITERATION
    assert len(outcome["final_placement"]) == 4 and len(set(outcome["final_placement"])) == 2
    assert outcome["env_steps"] >= 4 * 8 * PER_ITERATION  # the run stops on its step budget


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
@scenario("lose_chunk:{ranks}")
def test_a_chunk_lost_with_its_node_before_the_learner_read_it_is_collected_again_by_a_replacement(cluster_runs, ranks):
    outcome, out = outcome_of(cluster_runs, f"lose_chunk:{ranks}")
    # shard 0's chunk of iteration 3 finished before its node went, and the learner had not read it yet
    assert "shard 0 lost its chunk with its node before the learner read it (ChunksLost)" in out
    per_iteration = 2 * 16 * 512  # 2 shards x 16 rows x 512 steps
    assert outcome["steps"] == [per_iteration * (i + 1) for i in range(4)]  # every batch of its planned size
    assert outcome["iterations"] == 4 and outcome["env_steps"] == 4 * per_iteration
    assert outcome["removed"] == outcome["placement"][0] and outcome["removed"] not in outcome["final_placement"]


@pytest.mark.slow
@scenario("lose_state")
def test_a_shard_state_lost_with_its_node_before_the_save_is_saved_without_and_the_run_goes_on(cluster_runs):
    outcome, out = outcome_of(cluster_runs, "lose_state")
    assert "shard 0's state of iteration 2 was lost with its node" in out and "Traceback" not in out
    assert "saved without it; it continues from there with fresh episodes" in out
    per_iteration = 2 * 4096 * 4  # 2 shards x 4096 rows x 4 steps
    assert outcome["iterations"] == 4 and outcome["steps"] == [per_iteration * (i + 1) for i in range(4)]
    assert outcome["removed"] == outcome["placement"][0] and outcome["removed"] not in outcome["final_placement"]
