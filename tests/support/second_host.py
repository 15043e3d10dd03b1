"""A second "host" on this machine: a Ray worker node in its own mount namespace, blind to the driver's runs.

    with RayHead(num_cpus=2) as head, SecondHost(head, hidden=runs_parent, resources={"hostb": 3}):
        ...  # a task with resources={"hostb": 1} sees an empty runs_parent; the driver sees its files

    python -m tests.support.second_host learner|ranks HEAD_ADDRESS RUN_DIR

runs raysim as a driver attached to the head, with roles pinned to the second host, and prints one
JSON line of what happened (where each role ran, what it could see), for the tests to check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.ray_head import RAY, RayHead


class SecondHost:
    """``ray start --address <head>`` inside ``unshare --mount`` with a tmpfs over ``hidden``."""

    def __init__(self, head: RayHead, hidden: Path, num_cpus: int = 3, resources: dict | None = None):
        resources = json.dumps(resources or {"hostb": 10})  # roles ask for units of it, not CPUs
        start = (
            f"mount -t tmpfs tmpfs {hidden} && exec {RAY} start --address {head.address} --num-cpus {num_cpus} "
            f"--resources '{resources}' --temp-dir {head.base}/ray --disable-usage-stats --block"
        )
        self.command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", start]
        self.head = head

    @staticmethod
    def available() -> str | None:
        """Why a second host cannot be made here (None: it can)."""
        if shutil.which("unshare") is None:
            return "unshare is not installed"
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True
        )
        return None if probe.returncode == 0 else f"unshare --mount is not permitted: {probe.stderr.strip()}"

    def __enter__(self) -> SecondHost:
        self.process = subprocess.Popen(
            self.command, env=self.head.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        # the node's raylet carries the head's temp dir, its agents are the raylet's children: RayHead.stop ends them


def wait_for_node(ray, resource: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while ray.cluster_resources().get(resource, 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the second host (resource {resource}) did not join within {timeout} s")
        time.sleep(0.5)


class Placement:
    """A sink that records the node of every learner rank and shard at each log step."""

    def __init__(self, trainer):
        self.trainer, self.learner, self.shards = trainer, [], []

    def write(self, record: dict) -> None:
        import ray

        def node(handle) -> str:
            return ray.get(handle.actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))

        self.learner = [node(h) for h in self.trainer.session.roles.learner.handles]
        self.shards = [node(h) for h in self.trainer.session.roles.shards]

    def close(self) -> None:
        pass


def sees(run_dir: str) -> dict:
    """What a task on each kind of node finds at ``run_dir``'s parent."""
    import ray

    @ray.remote(num_cpus=0)
    def listing(path: str) -> list[str]:
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    parent = str(Path(run_dir).parent)
    hostb = ray.get(listing.options(resources={"hostb": 0.01}).remote(parent))
    return {"driver": sorted(os.listdir(parent)), "hostb": hostb}


def run_learner(run_dir: str) -> dict:
    """Learner and shards on the second host: train with a learner death, stop, resume, evaluate, export."""
    import raysim
    from raysim.coordinator import Trainer, faults
    from raysim.export import export_policy
    from tests.support.faulty_train import FaultAt

    base = [
        "backend=ray",
        "shards.count=2",
        "shards.num_cpus=0.5",
        "shards.resources={hostb: 1}",
        "learner.resources={hostb: 1}",
        "learner.num_cpus=1",
        "env.num_envs=4",
        "algo.num_steps=32",
        "algo.num_minibatches=2",
        "algo.update_epochs=1",
        "train.total_steps=2048",  # 8 iterations of 2 shards x 4 envs x 32 steps
        "eval.episodes=4",
        "eval.num_envs=2",
        "checkpoint.every=2",
        "train.sinks=[parquet]",
        "env.kwargs.initial_states={generate: 16, seed: 3}",
    ]
    first = Trainer(raysim.load_config(None, [*base, "train.stop_after=5", f"run_dir={run_dir}"]))
    placement = Placement(first)
    first.sinks = [placement]
    with faults.registered(FaultAt("update:3:learner")):  # the learner dies on the second host
        stopped = first.train()
    seen = sees(run_dir)
    resumed = Trainer.from_run_dir(run_dir).train()
    report = raysim.evaluate(run_dir, episodes=4)
    exported = export_policy(run_dir, str(Path(run_dir).parent / "policy.pt"))
    return {
        "placement": placement.learner + placement.shards,
        "stopped_at": stopped.iterations,
        "resumed_to": resumed.iterations,
        "env_steps": resumed.env_steps,
        "eval_completed": report.completed,
        "exported": Path(exported["out"]).is_file(),
        "sees": seen,
    }


def run_ranks(run_dir: str) -> dict:
    """Two learner ranks that can only fit one on each node."""
    import raysim
    from raysim.coordinator import Trainer

    config = raysim.load_config(
        None,
        [
            "backend=ray",
            "shards.count=2",
            "shards.num_cpus=0.5",
            "shards.resources={hostb: 1}",
            "learner.ranks=2",
            "learner.num_cpus=2",
            "env.num_envs=4",
            "algo.num_steps=32",
            "algo.num_minibatches=2",
            "algo.update_epochs=1",
            "train.total_steps=512",
            "eval.episodes=0",
            "train.sinks=[parquet]",
            f"run_dir={run_dir}",
        ],
    )
    trainer = Trainer(config)
    placement = Placement(trainer)
    trainer.sinks = [placement]
    summary = trainer.train()
    return {"learner_nodes": placement.learner, "iterations": summary.iterations}


def run_bc(run_dir: str) -> dict:
    """Behaviour cloning with its learner and evaluation shards on the second host, and the dataset of
    demonstrations where only the driver sees it: the driver reads it and hands it over the object store."""
    import raysim
    from raysim.coordinator import Trainer
    from raysim.coordinator.demonstrations import record_demonstrations

    datasets = Path(run_dir).parent / "datasets"
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    record_demonstrations("raysim/cartpole-random-v0", 4, config="cartpole_ppo", policy="random", backend="local")
    bc = "{name: bc, dataset: raysim/cartpole-random-v0, updates: 40, num_minibatches: 20, batch_size: 16}"
    overrides = ["backend=ray", f"algo={bc}", "learner.resources={hostb: 1}", "learner.num_cpus=1"]
    overrides += ["shards.resources={hostb: 1}", "shards.num_cpus=0.5", "eval.episodes=4", "eval.num_envs=2"]
    trainer = Trainer(raysim.load_config(None, [*overrides, "train.sinks=[parquet]", f"run_dir={run_dir}"]))
    placement = Placement(trainer)
    trainer.sinks = [placement]
    summary = trainer.train()
    return {
        "learner_nodes": placement.learner,
        "iterations": summary.iterations,
        "eval_completed": summary.evaluation.completed,
        "sees": sees(str(datasets / "raysim")),  # what each host finds in the datasets folder
    }


MODES = {"learner": run_learner, "ranks": run_ranks, "bc": run_bc}


def main(mode: str, address: str, run_dir: str) -> None:
    import ray

    ray.init(address=address)
    wait_for_node(ray, "hostb")
    outcome = MODES[mode](run_dir)
    outcome["nodes"] = {
        n["NodeID"]: sorted(k for k in n["Resources"] if k == "hostb") for n in ray.nodes() if n["Alive"]
    }
    print(json.dumps(outcome), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
