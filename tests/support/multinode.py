"""Training on a simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``), in its own process.

    python -m tests.support.multinode remove|grow|lose_chunk RUN_DIR [LEARNER_RANKS]

``remove``: 4 shards over 3 worker nodes; a worker node is removed mid-run.
``grow``: 2 shards on one worker node (elastic up to 4); a second node joins mid-run.
``lose_chunk``: 2 shards on 2 worker nodes, collecting one chunk ahead (``algo.max_policy_lag: 1``); shard 0's
node is removed once its next chunk finished, before the learner read it; a new node joins.
Prints one JSON line with what happened, for the test to check.
"""

from __future__ import annotations

import json
import sys

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
}


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
        if record["iteration"] != (2 if self.mode == "lose_chunk" else 3):
            return
        shards = self.trainer.session.roles.shards
        self.placement = [node_of(s) for s in shards]
        if self.mode == "lose_chunk":
            self.lose_a_finished_chunk()
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
        lost = next(n for n in self.workers if n.node_id == self.placement[0])
        self.removed = lost.node_id
        self.cluster.remove_node(lost)
        self.cluster.add_node(num_cpus=1, resources={"shard": 1})

    def close(self) -> None:
        pass


def main(mode: str, run_dir: str, ranks: int = 1) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": max(2, ranks)})  # the learner, the driver
    if mode == "lose_chunk":  # one shard per node
        workers = [cluster.add_node(num_cpus=1, resources={"shard": 1}) for _ in range(2)]
    else:
        workers = [cluster.add_node(num_cpus=2, resources={"shard": 2}) for _ in range(3 if mode == "remove" else 1)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    config = raysim.load_config(None, [*OVERRIDES[mode], f"learner.ranks={ranks}", f"run_dir={run_dir}"])
    trainer = Trainer(config)
    events = Events(trainer, cluster, mode, workers)
    trainer.sinks = [events]
    summary = trainer.train()
    final = events.final_placement
    print(
        json.dumps(
            {
                "steps": events.steps,
                "placement": events.placement,
                "final_placement": final,
                "removed": events.removed,
                "env_steps": summary.env_steps,
                "iterations": summary.iterations,
            }
        ),
        flush=True,
    )
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
