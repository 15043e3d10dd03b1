"""``raysim``: train, evaluate and benchmark from the command line."""

from __future__ import annotations

import argparse
import sys

from raysim.config import ConfigError, load_config

TRAIN_HELP = """Train PPO / GRPO on batched envs with Ray.

With no CONFIG, trains the packaged configs/cartpole_ppo.yaml on an embedded local Ray.
CONFIG is a YAML file or the name of a packaged config (e.g. cartpole_ppo).
Examples:
  raysim train
  raysim train configs/cartpole_ppo.yaml --set algo.lr=1e-3 --set shards.count=2
  RAY_ADDRESS=auto raysim train configs/cartpole_ppo.yaml     # attach to a running cluster
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raysim", description="Ray-based rollout collection and PPO/GRPO training.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train a policy", description=TRAIN_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("config", nargs="?", help="YAML config file or packaged config name (default: cartpole_ppo)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set algo.lr=1e-3 (repeatable)")
    train.add_argument("--run-dir", help="where to write the run (default: runs/<name>)")
    train.add_argument("--address", help="Ray cluster to attach to (default: $RAY_ADDRESS, else an embedded local Ray)")
    train.add_argument("--local", action="store_true", help="run every role in this process, without Ray")

    evaluate = commands.add_parser(
        "eval", help="evaluate a trained policy",
        description="Evaluate a run's newest checkpoint (or a checkpoint directory) over balanced, seeded episodes "
                    "and print the completion and success rates with Wilson intervals.")
    evaluate.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT")
    evaluate.add_argument("--episodes", type=int, default=100, help="episodes requested (default 100)")
    evaluate.add_argument("--seed", type=int, help="evaluation seed (default: the run's eval.seed)")
    evaluate.add_argument("--shards", type=int, help="evaluation shards (the result does not depend on it)")
    evaluate.add_argument("--envs-per-shard", type=int, help="rows per evaluation shard")
    evaluate.add_argument("--out", help="write one record per counted episode to this Parquet file")
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of argmax / mean")
    evaluate.add_argument("--no-quotas", action="store_true", help='count the first episodes to finish (biased; for comparison)')
    evaluate.add_argument("--local", action="store_true", help="run in this process, without Ray")
    evaluate.add_argument("--address", help="Ray cluster to attach to")

    bench = commands.add_parser("bench", help="benchmarks", description="Run a benchmark (see README).")
    bench.add_argument("name", choices=["collect"], help="collect: rollout collection latency against peers")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark (--help for its own)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return train(args)
        if args.command == "eval":
            return evaluate(args)
        if args.command == "bench":
            from raysim.bench.collect import main as collect

            return collect(args.args)
    except (ConfigError, FileNotFoundError) as error:
        print(f"raysim: error: {error}", file=sys.stderr)
        return 2
    return 0


def train(args: argparse.Namespace) -> int:
    from raysim.coordinator import Trainer

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.local:
        overrides.append("backend=local")
    config = load_config(args.config, overrides)
    print(f"raysim: training {config.name}: {config.env.id}, {config.shards.count} shard(s) x {config.env.num_envs} envs, "
          f"{config.algo.name}, {config.train.total_steps:,} env steps", flush=True)
    summary = Trainer(config, address=args.address).train()
    print(f"\ndone: {summary.env_steps:,} env steps in {summary.iterations} iterations, "
          f"{summary.wall_time:.1f} s training (+{summary.startup_time:.1f} s start-up), "
          f"{summary.env_steps / max(summary.wall_time, 1e-9):,.0f} steps/s")
    report = summary.evaluation
    if report is not None:
        r = report.returns
        mean = "n/a" if r["mean"] is None else f"{r['mean']:.1f} +- {r['std']:.1f}"
        print(f"evaluation: {report.completed}/{report.requested} episodes completed, return {mean}")
    print(f"run directory: {summary.run_dir}")
    return 130 if summary.interrupted else 0


def evaluate(args: argparse.Namespace) -> int:
    from raysim.evaluation import evaluate as run_evaluation, format_report

    report = run_evaluation(
        args.path, episodes=args.episodes, seed=args.seed, shards=args.shards, envs_per_shard=args.envs_per_shard,
        deterministic=not args.stochastic, balanced=not args.no_quotas, out=args.out,
        backend="local" if args.local else None, address=args.address,
    )
    print(format_report(report))
    if args.out:
        print(f"records: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
