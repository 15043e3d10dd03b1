"""Train from your own script: your Ray, raysim's Trainer.

    python examples/train_from_script.py                      # the packaged CartPole PPO config
    python examples/train_from_script.py 4096 shards.count=2  # a smaller budget, more overrides

The first argument (or $RAYSIM_TOTAL_STEPS) is the env-step budget; further KEY=VALUE arguments
are config overrides, as with ``raysim train --set``. The script starts Ray itself, so the Trainer
attaches to it and leaves it running; the script shuts it down when it is done.
"""

from __future__ import annotations

import os
import sys

import ray

import raysim


def main(argv: list[str]) -> int:
    total_steps = argv[0] if argv else os.environ.get("RAYSIM_TOTAL_STEPS", "40000")
    overrides = [f"train.total_steps={int(total_steps)}", *argv[1:]]
    config = raysim.load_config("cartpole_ppo", overrides=overrides)

    # Enough logical CPUs for the training shards, the evaluation shards and the learner.
    num_cpus = int(
        config.shards.count * config.shards.num_cpus
        + config.eval.shards * config.shards.num_cpus
        + config.learner.num_cpus
        + 0.999
    )
    ray.init(num_cpus=num_cpus, include_dashboard=False)
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
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
