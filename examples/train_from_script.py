"""Train from your own script: your Ray, raysim's Trainer. The recipe: docs/tasks/train-from-a-script.md.

    python examples/train_from_script.py                      # the full run: the packaged CartPole PPO config
    python examples/train_from_script.py --quick              # a tiny budget: seconds (and Ray's start)
    python examples/train_from_script.py 4096 shards.count=2  # a budget of your own, more overrides

The first argument (or $RAYSIM_TOTAL_STEPS) is the env-step budget; further KEY=VALUE arguments are config
overrides, as with ``raysim train --set``. The script starts Ray itself, sized for the run's roles, so the Trainer
attaches to it and leaves it running; the script shuts it down when it is done.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import ray

import raysim
from raysim.config import Config

QUICK = ["train.total_steps=2048", "eval.episodes=10"]  # two iterations of 1,024 env steps


def cpus_for(config: Config) -> int:
    """The logical CPUs the run's roles ask for: its training shards, its evaluation shards and its learner.

    The default config asks for 3 (1 + 1 + 1); a bare ``ray.init()`` on a 2-core machine offers 2, and the Trainer
    refuses the run with a ResourceError that lists each role's request."""
    shards = (config.shards.count + config.eval.shards) * config.shards.num_cpus
    return math.ceil(shards + config.learner.ranks * config.learner.num_cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("total_steps", nargs="?", type=int, default=int(os.environ.get("RAYSIM_TOTAL_STEPS", 40000)))
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, as raysim train --set")
    parser.add_argument("--quick", action="store_true", help="a tiny budget (2,048 env steps)")
    parser.add_argument("--out", help="where the run is written (default: runs/cartpole_ppo, as raysim train)")
    args = parser.parse_args(argv)
    run_dir = [f"run_dir={args.out}/cartpole_ppo"] if args.out else []
    overrides = [f"train.total_steps={args.total_steps}", *(QUICK if args.quick else []), *run_dir, *args.overrides]
    config = raysim.load_config("cartpole_ppo", overrides)

    started = not ray.is_initialized()  # a Ray this process already runs (a notebook's, the tests') is used as it is
    if started:
        ray.init(num_cpus=cpus_for(config), include_dashboard=False)
    try:
        summary = raysim.Trainer(config).train()
        print(f"env steps: {summary.env_steps}")
        print(f"iterations: {summary.iterations}")
        print(f"wall time: {summary.wall_time:.1f} s")
        print(f"last episode return: {summary.metrics.get('episode_return', float('nan')):.1f}")
        if summary.evaluation is not None:
            print(
                f"evaluation: {summary.evaluation.completed}/{summary.evaluation.requested} episodes, "
                f"mean return {summary.evaluation.mean_return}"
            )
        print(f"run directory: {summary.run_dir}")
        print(f"ray still initialized after train(): {ray.is_initialized()}")  # the Trainer did not start it
    finally:
        if started:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
