"""``raysim``: train, resume, evaluate, export, plot and benchmark from the command line.

Exit codes: 0 done (``train.stop_after`` too); 1 a run that failed (its last completed iteration saved
first) or a bug in raysim; 2 a mistake in the command line, a config or a path, or a cluster that
cannot run it (said in one or two lines, before anything is written); 130 / 143 after SIGINT / SIGTERM.
A traceback is printed only with ``--debug`` (or ``RAYSIM_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from raysim.checkpoint import CheckpointError
from raysim.config import ConfigError, load_config
from raysim.coordinator.cluster import RayStartFailed, ResourceError
from raysim.coordinator.trainer import RunFailed
from raysim.envs.errors import MissingDependencyError
from raysim.rollout.policies import SCRIPTED as SCRIPTED_POLICIES
from raysim.storage import StorageError, unwritable

if TYPE_CHECKING:
    from raysim.recording import Film

TRAIN_HELP = """Train PPO / GRPO on batched envs with Ray.

With no CONFIG, trains the packaged configs/cartpole_ppo.yaml on an embedded local Ray.
CONFIG is a YAML file or the name of a packaged config (e.g. cartpole_ppo); every key, its range and
its default: `raysim config`.
Examples:
  raysim train
  raysim train configs/cartpole_ppo.yaml --set algo.lr=1e-3 --set shards.count=2
  raysim train --address 10.0.0.5:6379          # attach to a running cluster (or RAY_ADDRESS)
"""


class UsageError(Exception):
    """A mistake in the command line (argparse's errors, raised instead of printed with the usage)."""


class OutputPathError(Exception):
    """An output path that cannot be written: the flag, the path and why."""


class MissingExtra(Exception):
    """A feature whose optional dependency is not installed: what needs it and the extra to install."""


USER_ERRORS = (
    ConfigError,
    CheckpointError,
    FileNotFoundError,
    StorageError,
    ResourceError,
    OutputPathError,
    MissingExtra,
    MissingDependencyError,
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def main(argv: list[str] | None = None) -> int:
    """The ``raysim`` command; returns its exit code."""
    import_from_here()
    debug = os.environ.get("RAYSIM_DEBUG", "") not in ("", "0")
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        print(f"raysim: error: {error}", file=sys.stderr)
        return 2
    debug = debug or args.debug
    try:
        with forgiving_stdout(args.command in RUNS):
            code = args.run(args)
            sys.stdout.flush()  # a reader that went away fails the flush here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # stdout's reader stopped reading (`raysim config algo | head -1`): nothing to add
        quiet_stdout()
        return 1
    except USER_ERRORS as error:
        print(f"raysim: error: {error}", file=sys.stderr)
        return 2
    except (RunFailed, RayStartFailed) as error:
        if debug:
            raise
        print(f"raysim: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before the run's own handlers were installed (e.g. while Ray starts)
        print("\nraysim: interrupted before training started: nothing to save", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        first = (str(error).strip().splitlines() or [""])[0]
        print(
            f"raysim: internal error: {type(error).__name__}: {first}\nthis is a bug in raysim: run again with "
            "--debug (or RAYSIM_DEBUG=1) for the traceback, and report it",
            file=sys.stderr,
        )
        return 1


def import_from_here() -> None:
    """Let a config name a module of the current folder (``env.id: my_env:MyEnv``, ``algo.name: my_algo:MyAlgo``) as
    ``python -m raysim`` does: the ``raysim`` script's path lacks it (appended: it never hides an installed package).
    Ray's workers have the driver's folder on their path already."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)


#: Commands that train or evaluate: a reader of their output that goes away (`raysim train | head -2`) costs only
#: the output, never the run's saves, evaluation or records.
RUNS = ("train", "resume", "tune", "eval")


class ForgivingStdout(io.TextIOBase):
    """Standard output that, once its reader is gone, discards what is written instead of raising."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            quiet_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            quiet_stdout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)  # isatty, fileno, encoding: the real stream's


@contextlib.contextmanager
def forgiving_stdout(enabled: bool) -> Iterator[None]:
    """``sys.stdout`` as a ``ForgivingStdout`` while a run goes on (``enabled``), then as it was."""
    if not enabled:
        yield
        return
    stream = sys.stdout
    sys.stdout = ForgivingStdout(stream)
    try:
        yield
    finally:
        sys.stdout = stream


def quiet_stdout() -> None:
    """Point stdout at the null device, so that Python's own flush at exit does not fail on the closed pipe."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # an in-process stdout without a file descriptor
        pass


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser = Parser(prog="raysim", description="Ray-based rollout collection and PPO/GRPO training.", parents=[common])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for add in (add_train, add_resume, add_tune, add_eval, add_demos, add_plot, add_export, add_bench, add_config):
        add(commands, common)
    return parser


def positive(text: str) -> int:
    """An integer >= 1 (for counts on the command line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


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
        "--address",
        help="Ray cluster to attach to, host:port (default: $RAY_ADDRESS, else a "
        "cluster running on this machine, else an embedded Ray); 'local': an embedded Ray",
    )
    parser.add_argument("--local", action="store_true", help="run every role in this process, without Ray")


def add_train(commands, common) -> None:
    train = commands.add_parser(
        "train",
        help="train a policy",
        description=TRAIN_HELP,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("config", nargs="?", help="YAML config file or packaged config name (default: cartpole_ppo)")
    train.add_argument("--run-dir", help="where to write the run, a new or empty directory (default: runs/<name>)")
    add_run_options(train)
    train.set_defaults(run=train_command)


def add_resume(commands, common) -> None:
    resume = commands.add_parser(
        "resume",
        parents=[common],
        help="continue a run from its newest intact checkpoint",
        description="Continue RUN_DIR (also after it was moved or copied) from its newest intact checkpoint, "
        "with the run's own config snapshot, or with --config: the original declaration, a whole run "
        "config, or an env config such as RUN_DIR/configs/gym.yaml. An env that differs from the "
        "checkpoint's is refused, listing every differing key. What --set changes is kept in the run's config. "
        "A run stopped before its first checkpoint starts over from its configs.",
    )
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument("--config", help="config to resume with (default: RUN_DIR/configs/train.yaml)")
    resume.add_argument("--force", action="store_true", help="resume even though the env differs (loud warning)")
    resume.add_argument("--break-lock", action="store_true", help="take the run over from the process holding its lock")
    add_run_options(resume)
    resume.set_defaults(run=resume_command)


TUNE_HELP = """Sweep hyperparameters with Ray Tune: each trial is a raysim run (its shards and learner in the
trial's placement group), reporting at every log step with its checkpoint.

KEY=KIND:ARGS, KIND one of: uniform:LOW:HIGH, loguniform:LOW:HIGH, randint:LOW:HIGH (HIGH excluded),
choice:A,B,..., grid:A,B,... (every value, times --samples). The metric (default eval_return, the
deterministic evaluation's mean return) is in every report: trials evaluate at every log step when the
config sets no eval.every, and the last evaluation is carried forward. The experiment directory (--dir,
default runs/<name>-sweep; a path or a URI) holds Tune's state, trials/<trial id>/ (one raysim run
directory each), sweep.yaml and, at the end, best.yaml: the best trial's config for `raysim train`.
Examples:
  raysim tune --param algo.lr=loguniform:1e-4:1e-2 --samples 8 --scheduler asha
  raysim tune configs/cartpole_ppo.yaml --param algo.ent_coef=choice:0,0.01 --param algo.lr=grid:3e-4,1e-3
  raysim tune --resume runs/cartpole_ppo-sweep         # continue an interrupted sweep
"""


def add_tune(commands, common) -> None:
    sweep = commands.add_parser(
        "tune",
        help="sweep hyperparameters with Ray Tune (ASHA, PBT, random / grid search)",
        description=TUNE_HELP,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("config", nargs="?", help="YAML config file or packaged config name (default: cartpole_ppo)")
    sweep.add_argument(
        "--param", dest="params", action="append", default=[], metavar="KEY=KIND:ARGS", help="a searched key"
    )
    sweep.add_argument("--params", dest="params_file", metavar="FILE", help="YAML mapping of KEY: KIND:ARGS")
    sweep.add_argument("--samples", type=positive, default=1, help="trials drawn from the space (default 1)")
    sweep.add_argument("--scheduler", choices=["fifo", "asha", "pbt"], default="fifo", help="default fifo")
    sweep.add_argument("--metric", default="eval_return", help="the metric optimized (default eval_return)")
    sweep.add_argument("--mode", choices=["max", "min"], default="max", help="default max")
    sweep.add_argument("--max-concurrent", type=positive, help="trials at once (default: as many as fit)")
    sweep.add_argument("--dir", help="the experiment directory, a path or a URI (default: runs/<name>-sweep)")
    sweep.add_argument("--resume", metavar="EXPERIMENT_DIR", help="continue the interrupted sweep in this directory")
    sweep.add_argument("--grace-period", type=positive, default=1, help="ASHA: reports before a stop (default 1)")
    sweep.add_argument("--reduction-factor", type=float, default=2.0, help="ASHA: 1 / fraction kept (default 2)")
    sweep.add_argument("--perturbation-interval", type=positive, default=2, help="PBT: reports between exploits")
    sweep.add_argument(
        "--quantile-fraction", type=float, default=0.25, help="PBT: the bottom fraction that exploits (default 0.25)"
    )
    sweep.add_argument(
        "--synch", action="store_true", help="PBT: perturb every trial together (exploits at fixed points)"
    )
    sweep.add_argument("--max-failures", type=int, default=2, help="retries of a failed trial (default 2)")
    add_run_options(sweep)
    sweep.set_defaults(run=tune_command)


EVAL_HELP = """Evaluate a policy over balanced, seeded episodes and print the completion and success rates with
Wilson intervals.

The policy is a run's newest intact checkpoint (or a checkpoint directory), with the run's own config, or,
with --config and --policy and no run, a scripted one in the env of a config: expert (the env's scripted
expert; raysim/MetaWorld has Meta-World's, by each row's task) or random (uniform actions over the action
space, keyed by the evaluation seed, the episode and its step). Episode j starts from the same seed whatever
the policy, so a trained policy and the scripted ones play the same episodes.
Examples:
  raysim eval runs/cartpole_ppo
  raysim eval --config metaworld_reach_ppo --policy expert --episodes 50 --local
  raysim eval --config my.yaml --policy random --set env.kwargs.max_episode_steps=200 --out random.parquet
"""


def add_eval(commands, common) -> None:
    evaluate = commands.add_parser(
        "eval",
        parents=[common],
        help="evaluate a trained policy, or a scripted one (expert, random)",
        description=EVAL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluate.add_argument(
        "path", nargs="?", metavar="RUN_DIR_OR_CHECKPOINT", help="the run (or checkpoint) whose policy is evaluated"
    )
    evaluate.add_argument(
        "--config", help="YAML config file or packaged config name whose env plays the --policy (no run needed)"
    )
    evaluate.add_argument(
        "--policy",
        choices=list(SCRIPTED_POLICIES),
        help="a scripted policy instead of a run's: expert (the env's scripted expert) or random (uniform actions)",
    )
    evaluate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --config: override a config value, e.g. --set env.kwargs.max_episode_steps=200 (repeatable)",
    )
    evaluate.add_argument("--episodes", type=positive, default=100, help="episodes requested (default 100)")
    evaluate.add_argument("--seed", type=int, help="evaluation seed (default: the run's or the config's eval.seed)")
    evaluate.add_argument("--shards", type=positive, help="evaluation shards (the result does not depend on it)")
    evaluate.add_argument(
        "--envs-per-shard", type=positive, help="rows per evaluation shard (the result does not depend on it either)"
    )
    evaluate.add_argument("--out", metavar="FILE.parquet", help="write one record per counted episode to this file")
    evaluate.add_argument(
        "--stochastic", action="store_true", help="sample a run's policy's actions instead of argmax / mean"
    )
    evaluate.add_argument(
        "--no-quotas", action="store_true", help="count the first episodes to finish (biased; depends on the layout)"
    )
    evaluate.add_argument("--local", action="store_true", help="run in this process, without Ray")
    evaluate.add_argument("--address", help="Ray cluster to attach to (host:port, or local)")
    add_video_options(evaluate)
    evaluate.set_defaults(run=eval_command)


def add_video_options(evaluate: argparse.ArgumentParser) -> None:
    video = evaluate.add_argument_group("video (the video extra)")
    video.add_argument(
        "--video",
        metavar="FILE.mp4",
        help="film the evaluation into this .mp4 or .gif: one frame per step, every row a tile",
    )
    video.add_argument(
        "--video-frames", type=positive, default=2000, metavar="N", help="frames the video holds at most (default 2000)"
    )
    video.add_argument(
        "--video-size",
        type=positive,
        default=128,
        metavar="PIXELS",
        help="pixels per side of a row's picture, for envs that draw their own (default 128)",
    )
    video.add_argument("--video-fps", type=positive, default=25, metavar="FPS", help="frames per second (default 25)")


DEMOS_HELP = """Datasets of demonstrations in Minari's format (pip install "raysim[demos]").

record: play a policy's episodes through the evaluation path (balanced, seeded, on evaluation shards) and
write the completed ones as a Minari dataset (HDF5; images stored raw) under $MINARI_DATASETS_PATH (default
~/.minari/datasets)/<ID>. The policy is a run's newest intact checkpoint (RUN_DIR), or --config CONFIG --policy
expert|random. Each step keeps every observation group as the env gives it (before env.frame_stack), the
policy's action, reward, terminated, truncated; each episode its reset seed, task, return, length, success.
The episodes are played from --seed, by default one derived from the config's seed and never eval.seed, so
a policy trained on them is not scored on the episodes it imitated (except where the env has few distinct
episodes: raysim/MetaWorld with goals: benchmark has 50 per task, and recording says so). The dataset stores
the env's Gymnasium spec where it has one (Minari's recover_environment).
info: what a dataset (an ID, or a dataset directory) holds.
Examples:
  raysim demos record --config metaworld_reach_ppo --policy expert --episodes 50 --dataset-id raysim/reach-expert-v0
  raysim demos record runs/cartpole_ppo --episodes 20 --dataset-id raysim/cartpole-ppo-v0 --local
  raysim demos info raysim/reach-expert-v0
"""


def add_demos(commands, common) -> None:
    demos = commands.add_parser(
        "demos",
        parents=[common],
        help="record datasets of demonstrations (Minari), or show one",
        description=DEMOS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = demos.add_subparsers(dest="demos_command", required=True, metavar="ACTION", parser_class=Parser)
    record = actions.add_parser(
        "record",
        parents=[common],
        help="record a policy's episodes as a Minari dataset",
        description=DEMOS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    record.add_argument("path", nargs="?", metavar="RUN_DIR_OR_CHECKPOINT", help="the run whose policy is recorded")
    record.add_argument("--config", help="YAML config file or packaged config name whose env plays the --policy")
    record.add_argument("--policy", choices=list(SCRIPTED_POLICIES), help="a scripted policy instead of a run's")
    record.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --config: override a config value, e.g. --set env.kwargs.end_on_success=true (repeatable)",
    )
    record.add_argument("--episodes", type=positive, required=True, help="episodes requested")
    record.add_argument("--dataset-id", required=True, metavar="ID", help="the Minari id, e.g. raysim/reach-expert-v0")
    record.add_argument(
        "--seed",
        type=int,
        help="evaluation seed of the episodes (default: derived from the config's seed; never eval.seed)",
    )
    record.add_argument("--stochastic", action="store_true", help="sample a run's policy's actions (default: mode)")
    record.add_argument("--shards", type=positive, help="evaluation shards (the episodes do not depend on it)")
    record.add_argument("--envs-per-shard", type=positive, help="rows per evaluation shard (nor on this)")
    record.add_argument("--local", action="store_true", help="run in this process, without Ray")
    record.add_argument("--address", help="Ray cluster to attach to (host:port, or local)")
    record.set_defaults(run=demos_record_command)
    info = actions.add_parser(
        "info",
        parents=[common],
        help="what a dataset holds",
        description=DEMOS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info.add_argument("dataset", metavar="DATASET", help="a Minari dataset id, or a dataset directory")
    info.set_defaults(run=demos_info_command)


def add_plot(commands, common) -> None:
    plot = commands.add_parser(
        "plot",
        parents=[common],
        help="plot a run's learning curves",
        description="Draw RUN_DIR's learning curve (episode return vs env steps), its losses, the evaluation "
        "success rate with its Wilson band (when evaluations with a success exist; else the time "
        "per iteration by phase) into one PNG.",
    )
    plot.add_argument("run_dir", metavar="RUN_DIR")
    plot.add_argument("--out", metavar="FILE.png", help="where to write the PNG (default: RUN_DIR/plots.png)")
    plot.set_defaults(run=plot_command)


def add_export(commands, common) -> None:
    export = commands.add_parser(
        "export",
        parents=[common],
        help="export a trained policy (TorchScript / ONNX)",
        description="Write the deterministic policy of a run's newest intact checkpoint (or a checkpoint directory) "
        "as a standalone file: a policy observation batch [B, obs_dim] (float32; an actor of several groups or "
        "images: a dict of its groups, model.actor_inputs) -> the action batch "
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
    export.set_defaults(run=export_command)


def add_bench(commands, common) -> None:
    bench = commands.add_parser("bench", parents=[common], help="benchmarks", description="Run a benchmark.")
    bench.add_argument(
        "name",
        choices=(
            "collect solve scale mujoco atari metaworld finetune distill startup store serving placement sinks rllib "
            "sac"
        ).split(),
        help="collect: rollout collection latency against peers; solve: time to solve CartPole; "
        "scale: env steps/s against shards, lockstep and overlapped; startup: start-up against Ray's floor; "
        "mujoco: MuJoCo locomotion returns and wall time against CleanRL (and raysim/Reach success); "
        "atari: Breakout collection and training env steps/s and raw game score against a CleanRL-style peer; "
        "metaworld: Meta-World collection env steps/s against a bare loop and a CleanRL-style loop; "
        "finetune: pick-place-v3 success of BC from expert demonstrations, PPO and GRPO fine-tuned from it; "
        "distill: ReachCamera success of a camera student distilled from a state teacher, against PPO from scratch; "
        "store: object-store bytes over a 500-iteration run stay flat; "
        "serving: a step's round trip to a policy server (Ray call, Compiled Graph, in-process) and the step split; "
        "placement: collocated shards against env workers + a policy server: policy bytes held and moved, USS, "
        "env steps/s; sinks: training env steps/s with the Parquet sink alone and with W&B as well; "
        "rllib: raysim's PPO beside RLlib's on the same tasks, budgets and placement: env steps/s, time to solve, "
        "returns, memory; sac: raysim's SAC beside CleanRL's on Hopper (returns, wall-clock), the update's cost with 2 "
        "and 10 critics, RLPD on pick-place-v3 from 5 demonstrations",
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark (--help for its own)")
    bench.set_defaults(run=bench_command)


def add_config(commands, common) -> None:
    config = commands.add_parser(
        "config",
        parents=[common],
        help="every config key: type, default, allowed values, meaning",
        description="Print the config reference (generated from the schema the loader checks).",
    )
    config.add_argument("prefix", nargs="?", default="", help="only the keys that start with this (e.g. algo)")
    config.add_argument("--markdown", action="store_true", help="as Markdown tables (docs/config-reference.md)")
    config.set_defaults(run=config_command)


# -- the commands -------------------------------------------------------------------------------


def train_command(args: argparse.Namespace) -> int:
    from raysim.coordinator import Trainer

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.local:
        overrides.append("backend=local")
    config = load_config(args.config, overrides)
    trainer = Trainer(config, address=args.address)
    trainer.announce()  # a taken run name: the first line says where this run goes
    if trainer.plan is None:  # no shards (BC): a budget of gradient steps on a dataset
        what = f"{config.algo.name} on {config.algo.dataset}, {trainer.schedule.planned:,} iterations"
    else:
        what = (
            f"{config.shards.count} shard(s) x {config.env.num_envs} envs, {config.algo.name}, "
            f"{config.train.total_steps:,} env steps"
        )
    print(f"raysim: training {config.name}: {config.env.id}, {what}", flush=True)
    return report(trainer.train())


def resume_command(args: argparse.Namespace) -> int:
    from raysim.coordinator import Trainer

    overrides = list(args.overrides) + (["backend=local"] if args.local else [])
    trainer = Trainer.from_run_dir(
        args.run_dir, args.config, overrides, force=args.force, address=args.address, break_lock=args.break_lock
    )
    return report(trainer.train())


def report(summary) -> int:
    """Print a training summary; the exit code (130 after SIGINT, 143 after SIGTERM, else 0)."""
    timing = f"{summary.wall_time:.1f} s training (+{summary.startup_time:.1f} s start-up)"
    if summary.env_steps or summary.steps_this_run:
        speed = f"{summary.steps_this_run / max(summary.wall_time, 1e-9):,.0f} steps/s"
        print(f"\ndone: {summary.env_steps:,} env steps in {summary.iterations} iterations, {timing}, {speed}")
    else:  # an algorithm without shards (BC): no env steps
        print(f"\ndone: {summary.iterations} iterations, {timing}")
    from raysim.evaluation import format_tasks

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
        for line in format_tasks(evaluation):
            print(line)
    if summary.interrupted:
        print(f"stopped before the end ({summary.stopped_by}): continue with `raysim resume {summary.run_dir}`")
    print(f"run directory: {summary.run_dir}")
    return summary.exit_code


def tune_command(args: argparse.Namespace) -> int:
    require_extra("ray.tune", "tune", "raysim tune needs Ray Tune")
    from raysim.sweep import resume, tune
    from raysim.sweep.space import load_params, parse_param

    if args.local:
        raise ConfigError("raysim tune: --local does not apply: every trial is a Ray Tune trial")
    if args.resume:
        if args.config or args.params or args.params_file or args.overrides:
            raise ConfigError("raysim tune --resume reads the sweep from its sweep.yaml: no CONFIG, --param, --set")
        grid = resume(args.resume, address=args.address)
    else:
        params = [parse_param(text) for text in args.params]
        if args.params_file:
            params += load_params(args.params_file)
        if not params:
            raise ConfigError("raysim tune: give at least one --param KEY=KIND:ARGS (or --params FILE)")
        config = load_config(args.config, args.overrides)
        grid = tune(
            config,
            {p.key: p.spec for p in params},
            samples=args.samples,
            scheduler=args.scheduler,
            metric=args.metric,
            mode=args.mode,
            max_concurrent=args.max_concurrent,
            experiment=args.dir,
            address=args.address,
            grace_period=args.grace_period,
            reduction_factor=args.reduction_factor,
            perturbation_interval=args.perturbation_interval,
            quantile_fraction=args.quantile_fraction,
            synch=args.synch,
            max_failures=args.max_failures,
        )
    return report_sweep(grid)


def report_sweep(grid) -> int:
    """Print the best trial, its config file and run directory; 1 when a trial failed, 130 when the sweep was
    stopped before its end (its best so far is printed)."""
    from raysim.sweep.sweep import BEST_FILE, best_trial, load_sweep, unfinished_trials
    from raysim.sweep.trial import TRIALS

    sweep = load_sweep(grid.experiment_path)
    unfinished = unfinished_trials(sweep.experiment)
    print(f"\nsweep: {len(grid)} trial(s), {grid.num_errors} failed; experiment directory: {sweep.experiment}")
    if unfinished:  # Ctrl-C or SIGTERM: Tune stopped the trials and saved the experiment's state
        print(f"sweep: stopped, {unfinished} trial(s) unfinished: `raysim tune --resume {sweep.experiment}` continues")
    found = best_trial(sweep, grid)
    if found is None:
        print(f"sweep: no trial reported {sweep.metric}: no best config")
        return 130 if unfinished else 1
    best, values = found
    trial = best.metrics.get("trial_id", "?")
    print(f"best trial {trial}: {sweep.metric} = {best.metrics.get(sweep.metric)} with {values}")
    print(f"best config: {sweep.experiment}/{BEST_FILE}  (train it: raysim train {sweep.experiment}/{BEST_FILE})")
    print(f"best run directory: {sweep.experiment}/{TRIALS}/{trial}")
    return 130 if unfinished else 1 if grid.num_errors else 0


def eval_command(args: argparse.Namespace) -> int:
    from raysim.coordinator import evaluate, evaluate_policy
    from raysim.evaluation import format_report

    check_policy_source(args, "raysim eval")
    if args.out:
        check_output(args.out, "--out")
    film = video_film(args) if args.video else None
    options = dict(
        episodes=args.episodes,
        seed=args.seed,
        shards=args.shards,
        envs_per_shard=args.envs_per_shard,
        balanced=not args.no_quotas,
        out=args.out,
        backend="local" if args.local else None,
        address=args.address,
        film=film,
    )
    try:
        if args.policy:
            report = evaluate_policy(args.config, args.policy, overrides=args.overrides, **options)
        else:
            report = evaluate(args.path, deterministic=not args.stochastic, **options)
    except BaseException:
        if film is not None:
            film.writer.abandon()  # no half video
        raise
    print(format_report(report))
    if args.out:
        print(f"records: {args.out}")
    if film is not None:
        writer = film.writer
        path = writer.close()
        cut = " (the --video-frames cap: the rest was not filmed)" if writer.cut else ""
        print(f"video: {path}: {writer.frames} frames{cut}" if path else "video: no frame (no step was played)")
    return 0


def check_policy_source(args: argparse.Namespace, command: str) -> None:
    """Refuse, in one line, a ``command`` (``raysim eval``, ``raysim demos record``) that names both a run and a
    scripted policy, or neither whole; ``--stochastic`` with a scripted policy; ``--set`` without ``--config``."""
    scripted = "--config CONFIG --policy {" + ",".join(SCRIPTED_POLICIES) + "}"
    if args.path and (args.config or args.policy):
        flag = "--policy" if args.policy else "--config"
        raise ConfigError(
            f"{command}: {flag} goes with no RUN_DIR_OR_CHECKPOINT: a run acts with its own config and policy; "
            f"use either {args.path} or {scripted}"
        )
    if args.path is None and not (args.config and args.policy):
        missing = "--policy" if args.config else "--config CONFIG" if args.policy else "RUN_DIR_OR_CHECKPOINT"
        raise ConfigError(f"{command}: give {missing} (a run: RUN_DIR_OR_CHECKPOINT; or {scripted})")
    if args.policy and args.stochastic:
        raise ConfigError(
            f"{command}: --stochastic samples a learned policy's actions; --policy {args.policy} chooses its own "
            "(random: uniform, expert: scripted): leave --stochastic out"
        )
    if args.overrides and not args.config:
        raise ConfigError(f"{command}: --set changes the config of --config; a run acts with its own config")


def video_film(args: argparse.Namespace) -> Film:
    """The film of ``raysim eval --video``, its path, file type and the extra checked first."""
    from raysim.recording import Film
    from raysim.video import VideoWriter, check_video_path, require_video

    check_output(args.video, "--video")
    check_video_path(args.video)
    if args.video_size < 8:
        raise ConfigError(f"--video-size must be >= 8 (pixels per side of a row's picture), got {args.video_size}")
    require_video()
    return Film(VideoWriter(args.video, args.video_fps, args.video_frames), args.video_size)


def demos_record_command(args: argparse.Namespace) -> int:
    from raysim.coordinator.demonstrations import record_demonstrations
    from raysim.evaluation import format_rate

    check_policy_source(args, "raysim demos record")
    recorded = record_demonstrations(
        args.dataset_id,
        args.episodes,
        run=args.path,
        config=args.config,
        policy=args.policy,
        overrides=args.overrides,
        seed=args.seed,
        deterministic=not args.stochastic,
        shards=args.shards,
        envs_per_shard=args.envs_per_shard,
        backend="local" if args.local else None,
        address=args.address,
    )
    report = recorded.report
    print(
        f"demos: {report.completed} of {report.requested} episodes completed and recorded, {recorded.steps:,} steps "
        f"(evaluation seed {recorded.seed}); success {format_rate(report.success_rate)}"
    )
    print(f"dataset: {recorded.dataset_id} at {recorded.path} (read it: minari.load_dataset({recorded.dataset_id!r}))")
    return 0


def demos_info_command(args: argparse.Namespace) -> int:
    from raysim.demos import dataset_info
    from raysim.demos.dataset import describe

    info = dataset_info(args.dataset)
    print(f"dataset: {args.dataset} at {info['path']}: {info['episodes']} episodes, {info['steps']:,} steps")
    groups = getattr(info["observation_space"], "spaces", {"": info["observation_space"]})
    print("observations: " + ", ".join(f"{g} {describe(space)}".strip() for g, space in groups.items()))
    print(f"actions: {describe(info['action_space'])}")
    for key, value in info["raysim"].items():
        if key != "canonical_env":
            print(f"{key}: {value}")
    return 0


def plot_command(args: argparse.Namespace) -> int:
    from raysim.plot import plot_run

    check_output(args.out or str(Path(args.run_dir) / "plots.png"), "--out")
    print(f"plot: {plot_run(args.run_dir, args.out)}")
    return 0


def export_command(args: argparse.Namespace) -> int:
    from raysim.export import ExportError, export_policy

    check_output(args.out, "--out")
    try:
        info = export_policy(args.path, args.out, args.format)
    except ExportError as error:
        raise OutputPathError(str(error)) from error
    state = "" if info["recurrent"] == "none" else f", {info['recurrent']} state [{info['state_size']}] in and out"
    print(
        f"export: {info['out']} ({info['format']}, {info['env_id']}, checkpoint {info['checkpoint']}, "
        f"obs {info['observation_shape'] if len(info['inputs']) == 1 else info['observation_shapes']} "
        f"-> {info['action_space']}"
        f"{', normalization baked in' if info['normalized'] else ''}{state})"
    )
    return 0


def bench_command(args: argparse.Namespace) -> int:
    import importlib

    return importlib.import_module(f"raysim.bench.{args.name}").main(args.args)


def config_command(args: argparse.Namespace) -> int:
    from raysim.reference import config_reference

    print(config_reference(args.prefix, markdown=args.markdown))
    return 0


def require_extra(module: str, extra: str, what: str) -> None:
    """Refuse, before any work, a feature whose optional dependency ``module`` is not installed."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f'{what}, which is not installed: pip install "raysim[{extra}]"') from None


def check_output(path: str, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a directory, a path under a file,
    a folder without write permission."""
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"{flag} {path} is a directory: give the file to write, e.g. {target / 'out'}")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(f"{flag} {path} exists and cannot be written (no write permission)")
    problem = unwritable(target.parent)
    if problem:
        raise OutputPathError(f"{flag} {path}: {problem}")
