"""Training on a simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``), in its own process.

    python -m tests.support.multinode RUN_ROOT SCENARIO...      # SCENARIO: remove, grow, lose_chunk:RANKS, lose_state

Every scenario is a run of its own (``RUN_ROOT/<scenario>``) on one cluster: one head (the driver, the
learner ranks), and for each scenario exactly the worker nodes it starts with (nodes alike kept from the
scenario before, the others removed, more added; a worker node then has no actor of an earlier run).

``remove``: 4 shards over 3 worker nodes; a worker node is removed mid-run.
``grow``: 2 shards on one worker node (elastic up to 4); a second node joins mid-run.
``lose_chunk:RANKS``: 2 shards on 2 worker nodes, collecting one chunk ahead (``algo.max_policy_lag: 1``),
``learner.ranks=RANKS``; shard 0's node is removed once its next chunk finished, before the learner read
it; a new node joins.
``lose_state``: 2 shards of 4096 rows on 2 worker nodes (a shard's state ~190 KB: in its node's object store);
shard 0's node is removed once iteration 2 completed, before its checkpoint fetched the shards' states; a new
node joins.

For each scenario it prints a line ``SCENARIO <name>`` before its run's output, and one line
``OUTCOME <json>`` after it: what happened, for the tests to check (``error``: the traceback of a scenario
that failed; the next one still runs).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

import raysim
from raysim.coordinator import Trainer

PER_SHARD = 4 * 32  # rows x steps
COMMON = [
    "backend=ray",
    "shards.resources={shard: 1}",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.log_every=1",
    "eval.episodes=0",
]
OVERRIDES = {
    "remove": [*COMMON, "shards.count=4", "env.num_envs=4", "algo.num_steps=32", f"train.total_steps={PER_SHARD * 32}"],
    "grow": [
        *COMMON,
        "shards.count=2",
        "shards.max=4",
        "env.num_envs=4",
        "algo.num_steps=32",
        f"train.total_steps={PER_SHARD * 32}",
    ],
    # chunks of 16 x 512 steps (> 100 KB: in the object store of the shard's node, not inlined in the driver's)
    "lose_chunk": [
        *COMMON,
        "shards.count=2",
        "env.num_envs=16",
        "algo.num_steps=512",
        "algo.max_policy_lag=1",
        f"train.total_steps={2 * 16 * 512 * 4}",
    ],
    "lose_state": [
        *COMMON,
        "shards.count=2",
        "env.num_envs=4096",
        "algo.num_steps=4",
        "checkpoint.every=2",
        f"train.total_steps={2 * 4096 * 4 * 4}",
    ],
}
# each scenario's worker nodes at its start: (count, CPUs and shard slots of each)
NODES = {"remove": (3, 2), "grow": (1, 2), "lose_chunk": (2, 1), "lose_state": (2, 1)}


def node_of(shard) -> str:
    return ray.get(shard.actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


class Events:
    """A sink that records each log step and changes the cluster once, at iteration 3."""

    def __init__(self, trainer: Trainer, cluster: Cluster, mode: str, workers: list):
        self.trainer, self.cluster, self.mode, self.workers = trainer, cluster, mode, workers
        self.steps: list[int] = []
        self.placement: list[str] = []
        self.final_placement: list[str] = []  # at the last log step (the run's actors end with it)
        self.removed = ""

    def write(self, record: dict) -> None:
        self.steps.append(int(record["env_steps"]))
        self.final_placement = [node_of(s) for s in self.trainer.session.roles.shards]
        if record["iteration"] != (2 if self.mode in ("lose_chunk", "lose_state") else 3):
            return
        shards = self.trainer.session.roles.shards
        self.placement = [node_of(s) for s in shards]
        if self.mode == "lose_chunk":
            self.lose_a_finished_chunk()
        elif self.mode == "lose_state":  # the iteration is complete, its checkpoint not yet saved
            self.replace_node(next(n for n in self.workers if n.node_id == self.placement[0]))
        elif self.mode == "remove":
            busiest = max(self.workers, key=lambda n: self.placement.count(n.node_id))
            self.removed = busiest.node_id
            self.cluster.remove_node(busiest)
        else:
            self.cluster.add_node(num_cpus=2, resources={"shard": 2})
            self.cluster.wait_for_nodes()

    def lose_a_finished_chunk(self) -> None:
        """Shard 0's node goes once the chunk it collected ahead (the next batch's) finished: the chunk is lost
        before the learner reads it. A new node takes its place."""
        ahead = [launch.receipt for launch in self.trainer.session.collector.lanes[0].queue]
        ray.wait(ahead, num_returns=len(ahead), fetch_local=False)
        self.replace_node(next(n for n in self.workers if n.node_id == self.placement[0]))

    def replace_node(self, node) -> None:
        """``node`` goes (what its object store held is lost); a new one takes its place."""
        self.removed = node.node_id
        self.cluster.remove_node(node)
        self.cluster.add_node(num_cpus=1, resources={"shard": 1})

    def close(self) -> None:
        pass


def shape(node) -> tuple[float, float]:
    """A worker node's CPUs and shard slots."""
    params = node._ray_params
    return params.num_cpus, (params.resources or {}).get("shard", 0)


def worker_nodes(cluster: Cluster, count: int, size: int) -> list:
    """Exactly ``count`` worker nodes of ``size`` CPUs and shard slots each: alike nodes kept, the others
    removed, the rest added; returned once the cluster has exactly their shard slots, all free (no actor of
    an earlier run holds one)."""
    kept = [n for n in cluster.worker_nodes if shape(n) == (size, size)][:count]
    for node in [n for n in cluster.worker_nodes if n not in kept]:
        cluster.remove_node(node)
    workers = kept + [cluster.add_node(num_cpus=size, resources={"shard": size}) for _ in range(count - len(kept))]
    cluster.wait_for_nodes()
    deadline = time.monotonic() + 60
    while not ray.cluster_resources().get("shard") == ray.available_resources().get("shard") == count * size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not settle on {count} worker nodes: {ray.cluster_resources()}")
        time.sleep(0.1)
    return workers


def run(cluster: Cluster, scenario: str, run_dir: Path) -> dict:
    mode, _, ranks = scenario.partition(":")
    workers = worker_nodes(cluster, *NODES[mode])
    config = raysim.load_config(None, [*OVERRIDES[mode], f"learner.ranks={ranks or 1}", f"run_dir={run_dir}"])
    trainer = Trainer(config)
    events = Events(trainer, cluster, mode, workers)
    trainer.sinks = [events]
    summary = trainer.train()
    return {
        "steps": events.steps,
        "placement": events.placement,
        "final_placement": events.final_placement,
        "removed": events.removed,
        "env_steps": summary.env_steps,
        "iterations": summary.iterations,
    }


def main(run_root: str, *scenarios: str) -> None:
    ranks = max([int(s.partition(":")[2] or 1) for s in scenarios] + [2])
    # the head: the driver and the learner ranks; no dashboard (a dozen processes to start on a 2-core machine)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": ranks, "include_dashboard": False})
    try:
        ray.init(address=cluster.address)
        for scenario in scenarios:
            print(f"SCENARIO {scenario}", flush=True)
            try:
                outcome = run(cluster, scenario, Path(run_root) / scenario.replace(":", "_"))
            except Exception:  # noqa: BLE001 - reported for its test; the next scenario runs
                outcome = {"error": traceback.format_exc()}
            print(f"OUTCOME {json.dumps(outcome)}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
