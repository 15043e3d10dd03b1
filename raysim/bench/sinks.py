"""Sinks benchmark: training env steps/s with the Parquet sink alone against Parquet + Weights & Biases.

One measurement is one CartPole PPO run (``--config``, default ``cartpole_ppo``) of ``--steps`` env steps in this
process, every role in it (``backend: local``: the coordinator, where the sinks run, shares its process with the
shard and the learner, so what a sink costs is not hidden behind them), no evaluation; its env steps/s is its steps
over its training seconds (``Summary.wall_time``: the start-up, ``wandb.init`` in it, is excluded). W&B logs in
offline mode (``WANDB_MODE=offline``, its files in a temporary directory, deleted at the end): the cost of logging
to the training process and of wandb's service process on the same cores, not of an upload.

Each ``--log-every`` (``train.log_every``: a log step is what a sink receives) is measured ``--repeats`` times
with each sink set, the order alternating every repeat, after one short warm-up run of each (not counted: it also
starts wandb's service). Medians (min-max), the ratio of the medians, the median of each repeat's own ratio
("paired") and Welch's 95 % interval of the difference of the means.
``raysim bench sinks [--steps N] [--repeats N] [--log-every 5 1] [--out FILE]``: the table to stdout; ``--out``
writes it to FILE and appends a JSON line (machine, load, dates, every measurement) to FILE's ``.jsonl``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path
from unittest import mock

import torch

from raysim.bench.results import installed_version, load, machine, now
from raysim.bench.welch import welch

PARQUET, WANDB = "parquet", "parquet + wandb"
SINKS = {PARQUET: "[parquet]", WANDB: "[parquet,wandb]"}
WARMUP_STEPS = 4096


def steps_per_second(config_name: str, sinks: str, steps: int, log_every: int, run_dir: Path) -> float:
    """One run's env steps over its training seconds (start-up excluded)."""
    import raysim

    overrides = [
        "backend=local",
        f"train.total_steps={steps}",
        f"train.log_every={log_every}",
        f"train.sinks={sinks}",
        "eval.episodes=0",
        f"run_dir={run_dir}",
    ]
    with redirect_stdout(sys.stderr):  # the runs' own lines (checkpoints saved) beside the progress, not the table
        summary = raysim.Trainer(raysim.load_config(config_name, overrides)).train()
    return summary.steps_this_run / summary.wall_time


def measure(args: argparse.Namespace, folder: Path) -> dict[int, dict[str, list[float]]]:
    """Every log-every setting's steps/s of each sink set, ``args.repeats`` of each, interleaved."""
    runs = itertools.count()
    for kind in SINKS.values():  # warm-ups: torch's first iterations, wandb's service
        steps_per_second(args.config, kind, WARMUP_STEPS, 1, folder / f"run{next(runs)}")
    results: dict[int, dict[str, list[float]]] = {}
    for log_every in args.log_every:
        results[log_every] = {PARQUET: [], WANDB: []}
        for i in range(args.repeats):
            for kind in (PARQUET, WANDB) if i % 2 == 0 else (WANDB, PARQUET):
                value = steps_per_second(args.config, SINKS[kind], args.steps, log_every, folder / f"run{next(runs)}")
                results[log_every][kind].append(value)
                print(f"[log_every {log_every}, {kind} {i + 1}/{args.repeats}: {value:,.0f} steps/s]", file=sys.stderr)
    return results


def table(results: dict[int, dict[str, list[float]]], header: str) -> str:
    """The Markdown table: each setting's medians side by side, their ratio and the difference's interval."""

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

    lines = [
        header,
        "",
        "| train.log_every | parquet steps/s | parquet + wandb steps/s | ratio of medians | paired ratio "
        "| wandb - parquet, 95 % interval |",
        "|---|---|---|---|---|---|",
    ]
    for log_every, values in results.items():
        alone, with_wandb = values[PARQUET], values[WANDB]
        ratio = statistics.median(with_wandb) / statistics.median(alone)
        paired = statistics.median(w / p for w, p in zip(with_wandb, alone, strict=True))
        if len(alone) > 1:
            difference = welch(with_wandb, alone)
            interval = f"{difference.difference:+,.0f} ({difference.low:+,.0f} to {difference.high:+,.0f})"
        else:
            interval = "-"
        lines.append(
            f"| {log_every} | {cell(alone)} | {cell(with_wandb)} | {ratio:.3f}x | {paired:.3f}x | {interval} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="raysim bench sinks", description="training steps/s with the Parquet sink alone and with W&B as well"
    )
    parser.add_argument("--config", default="cartpole_ppo", help="config name or YAML file (default cartpole_ppo)")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps of each measured run (default 100000)")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs of each sink set (default 3)")
    parser.add_argument(
        "--log-every", type=int, nargs="+", default=[5, 1], help="train.log_every settings (default 5 1)"
    )
    parser.add_argument("--out", type=Path, help="write the table here and append a JSON line to its .jsonl")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or min(args.log_every) < 1:
        parser.error("--repeats, --steps and --log-every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if installed_version("wandb") is None:
        print('raysim bench sinks: the wandb package is not installed; pip install -e ".[wandb]"', file=sys.stderr)
        return 2
    started, load_start = now(), load()
    with tempfile.TemporaryDirectory(prefix="raysim-bench-sinks-") as folder:
        with mock.patch.dict(os.environ, {"WANDB_MODE": "offline", "WANDB_DIR": folder, "WANDB_SILENT": "true"}):
            results = measure(args, Path(folder))
            import wandb

            wandb.teardown()  # its service process ends before its directory is deleted
    finished, load_end = now(), load()
    where = machine()
    header = (
        f"Training steps/s with the Parquet sink alone and with W&B as well ({args.config}, backend local, "
        f"{args.steps:,} env steps a run, start-up excluded; {where['host']}, {where['cpus']} cores, torch "
        f"{torch.__version__}, wandb {installed_version('wandb')} offline; {args.repeats} runs of each, interleaved, "
        f"after a warm-up of each; load average {load_start} at start, {load_end} at end; {started} to {finished})"
    )
    text = table(results, header)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        line = {
            "bench": "sinks",
            **where,
            "torch": torch.__version__,
            "wandb": installed_version("wandb"),
            "started": started,
            "finished": finished,
            "load_start": load_start,
            "load_end": load_end,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "steps_per_s": {str(k): v for k, v in results.items()},
        }
        with open(args.out.with_suffix(".jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
