"""``raysim``: train, evaluate and benchmark from the command line."""

from __future__ import annotations

import argparse
import sys

from raysim.checkpoint import CheckpointError
from raysim.config import ConfigError, load_config
from raysim.coordinator.trainer import RunFailed
from raysim.storage import RunLockedError

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
    for add in (add_train, add_resume, add_eval, add_plot, add_export, add_bench):
        add(commands)
    return parser


def add_train(commands) -> None:
    train = commands.add_parser(
        "train", help="train a policy", description=TRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    train.add_argument("config", nargs="?", help="YAML config file or packaged config name (default: cartpole_ppo)")
    train.add_argument("--run-dir", help="where to write the run (default: runs/<name>)")
    add_run_options(train)


def add_resume(commands) -> None:
    resume = commands.add_parser(
        "resume",
        help="continue a run from its newest intact checkpoint",
        description="Continue RUN_DIR (also after it was moved or copied) from its newest intact checkpoint, "
        "with the run's own config snapshot, or with --config: the original declaration, a whole run "
        "config, or an env config such as RUN_DIR/configs/gym.yaml. An env that differs from the "
        "checkpoint's is refused, listing every differing key.",
    )
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument("--config", help="config to resume with (default: RUN_DIR/configs/train.yaml)")
    resume.add_argument("--force", action="store_true", help="resume even though the env differs (loud warning)")
    resume.add_argument(
        "--break-lock", action="store_true", help="take the run over from the process that holds its lock"
    )
    add_run_options(resume)


def add_eval(commands) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a trained policy",
        description="Evaluate a run's newest checkpoint (or a checkpoint directory) over balanced, seeded episodes "
        "and print the completion and success rates with Wilson intervals.",
    )
    evaluate.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT")
    evaluate.add_argument("--episodes", type=int, default=100, help="episodes requested (default 100)")
    evaluate.add_argument("--seed", type=int, help="evaluation seed (default: the run's eval.seed)")
    evaluate.add_argument("--shards", type=int, help="evaluation shards (the result does not depend on it)")
    evaluate.add_argument("--envs-per-shard", type=int, help="rows per evaluation shard")
    evaluate.add_argument("--out", help="write one record per counted episode to this Parquet file")
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of argmax / mean")
    evaluate.add_argument(
        "--no-quotas", action="store_true", help="count the first episodes to finish (biased; for comparison)"
    )
    evaluate.add_argument("--local", action="store_true", help="run in this process, without Ray")
    evaluate.add_argument("--address", help="Ray cluster to attach to")


def add_plot(commands) -> None:
    plot = commands.add_parser(
        "plot",
        help="plot a run's learning curves",
        description="Draw RUN_DIR's learning curve (episode return vs env steps), its losses, the evaluation "
        "success rate with its Wilson band (when evaluations with a success exist; else the time "
        "per iteration by phase) into one PNG.",
    )
    plot.add_argument("run_dir", metavar="RUN_DIR")
    plot.add_argument("--out", metavar="FILE.png", help="where to write the PNG (default: RUN_DIR/plots.png)")


def add_export(commands) -> None:
    export = commands.add_parser(
        "export",
        help="export a trained policy (TorchScript / ONNX)",
        description="Write the deterministic policy of a run's newest checkpoint (or a checkpoint directory) as a "
        "standalone file: a policy observation batch [B, obs_dim] (float32) -> the action batch "
        "(discrete: int64 argmax; continuous: the mean clipped or squashed into the action space), "
        "observation normalization baked in. Loading it needs torch or an ONNX runtime, not raysim.",
    )
    export.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT")
    export.add_argument(
        "--format",
        choices=["torchscript", "onnx"],
        default="torchscript",
        help="torchscript (torch.jit.load) or onnx (needs: pip install 'raysim[export]')",
    )
    export.add_argument("--out", required=True, metavar="FILE", help="where to write the policy (.pt / .onnx)")


def add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks", description="Run a benchmark (see README).")
    bench.add_argument(
        "name",
        choices=["collect", "solve"],
        help="collect: rollout collection latency against peers; solve: PPO time to solve CartPole",
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark (--help for its own)")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--set, --address and --local: the options of every command that trains."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set algo.lr=1e-3 (repeatable)",
    )
    parser.add_argument(
        "--address", help="Ray cluster to attach to (default: $RAY_ADDRESS, else an embedded local Ray)"
    )
    parser.add_argument("--local", action="store_true", help="run every role in this process, without Ray")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return train(args)
        if args.command == "resume":
            return resume(args)
        if args.command == "eval":
            return evaluate(args)
        if args.command == "plot":
            from raysim.plot import plot_run

            print(f"plot: {plot_run(args.run_dir, args.out)}")
            return 0
        if args.command == "export":
            from raysim.export import ExportError, export_policy

            try:
                info = export_policy(args.path, args.out, args.format)
            except ExportError as error:
                print(f"raysim: error: {error}", file=sys.stderr)
                return 2
            print(
                f"export: {info['out']} ({info['format']}, {info['env_id']}, checkpoint {info['checkpoint']}, "
                f"obs {info['observation_shape']} -> {info['action_space']}"
                f"{', normalization baked in' if info['normalized'] else ''})"
            )
            return 0
        if args.command == "bench":
            if args.name == "solve":
                from raysim.bench.solve import main as solve

                return solve(args.args)
            from raysim.bench.collect import main as collect

            return collect(args.args)
    except (ConfigError, FileNotFoundError, CheckpointError, RunLockedError) as error:
        print(f"raysim: error: {error}", file=sys.stderr)
        return 2
    except RunFailed as error:
        print(f"raysim: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before the run's own handlers were installed (e.g. while Ray starts)
        print("\nraysim: interrupted before training started: nothing to save", file=sys.stderr)
        return 130
    return 0


def train(args: argparse.Namespace) -> int:
    from raysim.coordinator import Trainer

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.local:
        overrides.append("backend=local")
    config = load_config(args.config, overrides)
    print(
        f"raysim: training {config.name}: {config.env.id}, {config.shards.count} shard(s) x "
        f"{config.env.num_envs} envs, {config.algo.name}, {config.train.total_steps:,} env steps",
        flush=True,
    )
    return report(Trainer(config, address=args.address).train())


def resume(args: argparse.Namespace) -> int:
    from raysim.coordinator import Trainer

    overrides = list(args.overrides) + (["backend=local"] if args.local else [])
    trainer = Trainer.from_run_dir(
        args.run_dir, args.config, overrides, force=args.force, address=args.address, break_lock=args.break_lock
    )
    return report(trainer.train())


def report(summary) -> int:
    """Print a training summary; the exit code (130 after SIGINT, 143 after SIGTERM, else 0)."""
    print(
        f"\ndone: {summary.env_steps:,} env steps in {summary.iterations} iterations, "
        f"{summary.wall_time:.1f} s training (+{summary.startup_time:.1f} s start-up), "
        f"{summary.steps_this_run / max(summary.wall_time, 1e-9):,.0f} steps/s"
    )
    evaluation = summary.evaluation
    if evaluation is not None:
        r = evaluation.returns
        mean = "n/a" if r["mean"] is None else f"{r['mean']:.1f} +- {r['std']:.1f}"
        left_out = f" ({evaluation.excluded} left out: non-finite values)" if evaluation.excluded else ""
        print(f"evaluation: {evaluation.completed}/{evaluation.requested} episodes completed{left_out}, return {mean}")
        rate = evaluation.success_rate
        if rate is not None and rate.value is not None:
            lo, hi = rate.interval
            print(
                f"success: {rate.numerator}/{rate.denominator} = {rate.value:.3f}  "
                f"[{lo:.3f}, {hi:.3f}] {100 * evaluation.confidence:g}% Wilson"
            )
    if summary.interrupted:
        print(f"stopped before the end ({summary.stopped_by}): continue with `raysim resume {summary.run_dir}`")
    print(f"run directory: {summary.run_dir}")
    return summary.exit_code


def evaluate(args: argparse.Namespace) -> int:
    from raysim.coordinator import evaluate as run_evaluation
    from raysim.evaluation import format_report

    report = run_evaluation(
        args.path,
        episodes=args.episodes,
        seed=args.seed,
        shards=args.shards,
        envs_per_shard=args.envs_per_shard,
        deterministic=not args.stochastic,
        balanced=not args.no_quotas,
        out=args.out,
        backend="local" if args.local else None,
        address=args.address,
    )
    print(format_report(report))
    if args.out:
        print(f"records: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
