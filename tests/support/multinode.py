"""Training on a simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``), in its own process.

    python -m tests.support.multinode remove|grow RUN_DIR

``remove``: 4 shards over 3 worker nodes; a worker node is removed mid-run.
``grow``: 2 shards on one worker node (elastic up to 4); a second node joins mid-run.
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
        self.final_placement = [node_of(s) for s in self.trainer.roles.shards]
        if record["iteration"] != 3:
            return
        shards = self.trainer.roles.shards
        self.placement = [node_of(s) for s in shards]
        if self.mode == "remove":
            busiest = max(self.workers, key=lambda n: self.placement.count(n.node_id))
            self.removed = busiest.node_id
            self.cluster.remove_node(busiest)
        else:
            self.cluster.add_node(num_cpus=2, resources={"shard": 2})
            self.cluster.wait_for_nodes()

    def close(self) -> None:
        pass


def main(mode: str, run_dir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})  # the learner and the driver
    workers = [cluster.add_node(num_cpus=2, resources={"shard": 2}) for _ in range(3 if mode == "remove" else 1)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    shards = ["shards.count=4"] if mode == "remove" else ["shards.count=2", "shards.max=4"]
    config = raysim.load_config(
        None,
        [
            "backend=ray",
            *shards,
            "shards.resources={shard: 1}",
            "env.num_envs=4",
            "algo.num_steps=32",
            "algo.num_minibatches=2",
            "algo.update_epochs=1",
            f"train.total_steps={PER_SHARD * 4 * 8}",
            "train.log_every=1",
            "eval.episodes=0",
            f"run_dir={run_dir}",
        ],
    )
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
    main(sys.argv[1], sys.argv[2])
