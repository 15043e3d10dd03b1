"""Sweep CartPole PPO's learning rate with Ray Tune, then read the trials and the best config. The recipe:
docs/tasks/sweep.md.

    python examples/sweep.py            # the full run: 4 samples of a log-uniform rate, ASHA (about 35 s)
    python examples/sweep.py --quick    # a tiny budget: seconds

Needs Ray Tune: pip install -e ".[tune]". Every trial is a whole raysim run (its own run directory under the
experiment's trials/); the sweep runs on the Ray this process started, else a cluster started on this machine,
else an embedded Ray sized for the largest trial.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import raysim

QUICK = {  # 2 trials, each 4 iterations of 1,024 env steps with an evaluation of 5 episodes (Tune's metric) at each
    "overrides": ["train.total_steps=4096", "train.log_every=1", "eval.episodes=5", "backend=local"],
    "params": {"algo.lr": "grid:1e-3,1e-2"},
    "options": {"samples": 1, "scheduler": "fifo"},
}
# 4 samples, trials of 1 CPU, ASHA stopping the worse ones early. No eval.max_steps: an evaluation whose episodes
# all outlast it completes none and reports NaN, which Tune cannot rank (the best policies' fate).
FULL = {
    "overrides": [
        "train.total_steps=8192",
        "train.log_every=2",
        "shards.num_cpus=0.3",
        "learner.num_cpus=0.3",
        "eval.episodes=10",
    ],
    "params": {"algo.lr": "loguniform:1e-4:1e-2"},
    "options": {"samples": 4, "scheduler": "asha"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two trials of a tiny budget")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where the experiment is written")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    experiment = args.out / "lr-sweep"

    config = raysim.load_config("cartpole_ppo", plan["overrides"])
    grid = raysim.tune(config, plan["params"], max_concurrent=2, experiment=str(experiment), **plan["options"])

    print(f"\n{len(grid)} trials, {grid.num_errors} failed")
    for result in sorted(grid, key=lambda r: r.config["algo.lr"]):
        print(f"algo.lr {result.config['algo.lr']:.5f}: eval_return {result.metrics['eval_return']:6.1f}")
    best = grid.get_best_result()
    print(f"best: algo.lr {best.config['algo.lr']:.5f}, eval_return {best.metrics['eval_return']:.1f}")
    print(f"best config: {experiment / 'best.yaml'} (raysim train {experiment / 'best.yaml'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
