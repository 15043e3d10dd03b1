"""Train on a running Ray cluster, as the entrypoint of `ray job submit`. The recipe: docs/tasks/run-on-a-cluster.md.

    ray job submit --working-dir . -- python examples/cluster_job.py --out /shared/runs   # on a cluster
    python examples/cluster_job.py            # the full run
    python examples/cluster_job.py --quick    # a tiny budget: seconds

Under `ray job submit`, Ray sets RAY_ADDRESS for the entrypoint: the script attaches to that cluster and the
shards and the learner are placed on its nodes. Run directly, it uses the Ray this process already started,
else a cluster started on this machine (`ray start --head`), else an embedded Ray, as `raysim train` does.
The run directory is written by this driver only: on a cluster give --out a path that outlives the job (a
shared filesystem, or s3://bucket/runs), not the job's working directory, which Ray removes.
"""

from __future__ import annotations

import argparse
import os
import sys

import ray

import raysim

# A tiny budget: 4 iterations of 2 shards x 4 rows x 32 steps, 4 evaluation episodes.
QUICK = [
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "train.total_steps=1024",
    "train.log_every=2",
    "eval.episodes=4",
    "eval.num_envs=2",
]


def describe_cluster() -> None:
    """The cluster this driver is attached to: its live nodes and logical CPUs."""
    nodes = [node for node in ray.nodes() if node["Alive"]]
    print(f"cluster: {len(nodes)} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget")
    parser.add_argument("--out", default="runs", help="where the run is written: a path or a URI (s3://...)")
    parser.add_argument("--shards", type=int, default=2, help="training shards (each 1 CPU, on any node)")
    args = parser.parse_args(argv)
    overrides = [f"shards.count={args.shards}", f"run_dir={args.out.rstrip('/')}/cluster_job"]
    config = raysim.load_config("cartpole_ppo", [*overrides, *(QUICK if args.quick else [])])

    attached_here = False
    if not ray.is_initialized() and os.environ.get("RAY_ADDRESS"):
        ray.init()  # the job's cluster (or the one RAY_ADDRESS names)
        attached_here = True
    try:
        if ray.is_initialized():
            describe_cluster()
        summary = raysim.Trainer(config).train()  # attaches to the Ray of this process, or finds one
    finally:
        if attached_here:
            ray.shutdown()
    print(f"trained {summary.env_steps:,} env steps in {summary.iterations} iterations ({summary.wall_time:.1f} s)")
    print(f"evaluation: mean return {summary.evaluation.mean_return:.1f} over {summary.evaluation.completed} episodes")
    print(f"run directory: {summary.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
