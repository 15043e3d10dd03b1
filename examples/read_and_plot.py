"""Read a run's results: its metric rows, its evaluation records, its TensorBoard scalars; plot them. The recipe:
docs/tasks/read-and-plot-results.md.

    python examples/read_and_plot.py            # the full run: CartPole PPO, evaluated every 10 iterations
    python examples/read_and_plot.py --quick    # a tiny budget: seconds

Everything here comes with the base install (pyarrow, matplotlib, tensorboard).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import raysim
from raysim.plot import plot_run
from raysim.records import read_metrics
from raysim.storage import open_storage

# 8 iterations of 8 rows x 64 steps, a row of metrics at each, an evaluation of 10 episodes every 2; every role
# in this process.
QUICK = ["backend=local", "algo.num_steps=64", "train.total_steps=4096", "train.log_every=1", "eval.episodes=10"]


def train(out: Path, quick: bool) -> Path:
    """A run that evaluates during training too, so that it has evaluation records to read."""
    overrides = [f"run_dir={out / 'cartpole_ppo'}", f"eval.every={2 if quick else 10}", *(QUICK if quick else [])]
    return Path(raysim.Trainer(raysim.load_config("cartpole_ppo", overrides)).train().run_dir)


def read_rows(run: Path) -> list[dict[str, float]]:
    """The metric rows, one per log step (``metrics/`` holds Parquet parts; ``read_metrics`` reads them in order)."""
    rows = read_metrics(open_storage(str(run)))
    columns = sorted({key for row in rows for key in row})
    evaluation = [c for c in columns if c.startswith("eval_")]
    print(f"metrics: {len(rows)} rows, {len(columns)} columns, of the evaluations: {', '.join(evaluation)}")
    last = rows[-1]
    print(f"last row: env_steps {last['env_steps']:.0f}, episode_return {last['episode_return']:.1f}")
    return rows


def read_evaluations(run: Path) -> list[tuple[int, float]]:
    """(iteration, mean return) of every evaluation: ``eval/<iteration>.parquet``, one record per episode."""
    points = []
    for path in sorted((run / "eval").glob("*.parquet"), key=lambda p: int(p.stem)):
        table = pq.read_table(path)
        mean = pc.mean(table["return"]).as_py()
        print(f"eval/{path.name}: {table.num_rows} episodes, mean return {mean:.1f}; columns {table.column_names}")
        points.append((int(path.stem), mean))
    return points


def read_tensorboard(run: Path) -> None:
    """The same rows as TensorBoard scalars (``tb/``, x axis: env steps)."""
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    returns = events.Scalars("train/episode_return")
    print(f"tensorboard: {len(events.Tags()['scalars'])} scalar tags; train/episode_return at step {returns[-1].step}")


def plot(run: Path, rows: list[dict[str, float]], evaluations: list[tuple[int, float]]) -> Path:
    """Training return against env steps, with the evaluations' mean return, in one PNG."""
    steps_at = {row["iteration"]: row["env_steps"] for row in rows}
    trained = [(row["env_steps"], row["episode_return"]) for row in rows if "episode_return" in row]
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    axes.plot(*zip(*trained, strict=True), label="training episodes")
    evaluated = [(steps_at[i], mean) for i, mean in evaluations if i in steps_at]
    axes.plot(*zip(*evaluated, strict=True), "o", label="evaluation")
    axes.set_xlabel("env steps")
    axes.set_ylabel("mean return")
    axes.legend()
    figure.savefig(run / "returns.png")
    return run / "returns.png"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where the run is written")
    args = parser.parse_args(argv)
    run = train(args.out / "read_and_plot", args.quick)

    rows = read_rows(run)
    evaluations = read_evaluations(run)
    read_tensorboard(run)
    print(f"wrote {plot(run, rows, evaluations)}")
    print(f"wrote {plot_run(run)} (what `raysim plot {run}` draws)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
