"""``raysim plot RUN_DIR``: the learning curve, the losses, the evaluations, the time split, as one PNG.

Reads what a run wrote (``metrics.parquet``, ``eval/<iteration>.parquet``, ``configs/train.yaml``)
and draws with matplotlib's Agg backend (no display needed; pyplot's global backend untouched).
Only the command line imports this module: envs, rollout, algos and the trainer never do.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from raysim.evaluation import wilson
from raysim.records import read_metrics, read_table
from raysim.storage import RunStorage, open_storage

LOSSES = ("pg_loss", "v_loss", "kl", "entropy")  # the loss panels, in order, where the run has them
TIMES = ("time_collect", "time_update", "time_eval", "time_checkpoint")


@dataclass
class EvalPoint:
    """One evaluation file: its iteration, env steps, returns, and successes k of c (None: no success)."""

    iteration: int
    env_steps: float
    mean_return: float | None
    std_return: float | None
    successes: int | None
    completed: int
    interval: tuple[float, float] | None


def metric_columns(storage: RunStorage) -> dict[str, np.ndarray]:
    """The metrics rows as columns (float arrays, NaN where a row has no value), sorted by iteration."""
    rows = read_metrics(storage)
    if not rows:
        raise FileNotFoundError(f"{storage.path()} has no metrics rows: is it a raysim run directory?")
    rows.sort(key=lambda r: r.get("iteration") or 0)
    keys = {k for row in rows for k in row}
    return {k: np.array([math.nan if row.get(k) is None else float(row[k]) for row in rows]) for k in keys}


def read_evaluations(storage: RunStorage, metrics: dict[str, np.ndarray], confidence: float) -> list[EvalPoint]:
    """Every ``eval/<iteration>.parquet``: k / c with its Wilson interval, placed at its env steps."""
    files = []
    for name in storage.list("eval"):
        stem = name.removesuffix(".parquet")
        if name.endswith(".parquet") and stem.isdigit():
            files.append((int(stem), f"eval/{name}"))
    iterations = np.concatenate([[0.0], metrics.get("iteration", np.zeros(0))])
    steps = np.concatenate([[0.0], metrics.get("env_steps", np.zeros(0))])
    points = []
    for iteration, path in sorted(files):
        records = read_table(storage, path).to_pylist()
        returns = [float(r["return"]) for r in records if r.get("return") is not None]
        has_success = bool(records) and all(r.get("success") is not None for r in records)
        k = sum(bool(r["success"]) for r in records) if has_success else None
        points.append(
            EvalPoint(
                iteration=iteration,
                env_steps=float(np.interp(iteration, iterations, steps)) if len(iterations) > 1 else float(iteration),
                mean_return=float(np.mean(returns)) if returns else None,
                std_return=float(np.std(returns)) if returns else None,
                successes=k,
                completed=len(records),
                interval=wilson(k, len(records), confidence) if k is not None else None,
            )
        )
    return points


def eval_confidence(storage: RunStorage) -> float:
    """The run's ``eval.confidence`` (0.95 when the snapshot does not say)."""
    try:
        config = yaml.safe_load(storage.read("configs/train.yaml")) or {}
        return float((config.get("eval") or {}).get("confidence", 0.95))
    except (OSError, yaml.YAMLError, TypeError, ValueError, AttributeError):
        return 0.95


def plot_run(run_dir: str | Path, out: str | Path | None = None, dpi: int = 80) -> str:
    """Draw the run's curves into ``out`` (default ``RUN_DIR/plots.png``, a local path or a URI); where."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    storage = open_storage(str(run_dir))
    metrics = metric_columns(storage)
    confidence = eval_confidence(storage)
    evaluations = read_evaluations(storage, metrics, confidence)
    x = metrics.get("env_steps", np.arange(len(next(iter(metrics.values()), []))))

    figure = Figure(figsize=(12, 7), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 3)
    figure.suptitle(f"raysim run {storage.location.rstrip('/').rpartition('/')[2]}")

    curve = figure.add_subplot(grid[0, :2])
    draw_returns(curve, x, metrics, evaluations)
    side = figure.add_subplot(grid[0, 2])
    if any(p.successes is not None for p in evaluations):
        draw_success(side, evaluations, confidence)
    else:
        draw_times(side, x, metrics)
    losses = [k for k in LOSSES if k in metrics and np.isfinite(metrics[k]).any()][:3]
    for column, key in enumerate(losses):
        axes = figure.add_subplot(grid[1, column])
        axes.plot(x, metrics[key], color=f"C{column + 2}", lw=1.5, marker="o" if len(x) <= 20 else None, ms=3)
        axes.set_title(key)
        axes.set_xlabel("env steps")
        axes.grid(alpha=0.3)
        if key == "v_loss" and np.nanmin(metrics[key]) > 0:
            axes.set_yscale("log")
    for axes in figure.axes:  # compact env-step ticks (10k, 1.5M), few enough for the narrow panels
        axes.xaxis.set_major_locator(MaxNLocator(5))
        axes.xaxis.set_major_formatter(FuncFormatter(steps_label))
    if out is None:  # beside the run, wherever it is
        buffer = io.BytesIO()
        figure.savefig(buffer, dpi=dpi, format="png")
        storage.write("plots.png", buffer.getvalue())
        return storage.path("plots.png")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=dpi)
    return str(out)


def steps_label(value: float, _position: object = None) -> str:
    """An env-step count for an axis: 0, 500, 10k, 1.5M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def draw_returns(axes, x: np.ndarray, metrics: dict[str, np.ndarray], evaluations: list[EvalPoint]) -> None:
    """Training episode return (mean, min-max band) and evaluation returns (mean +- std) vs env steps."""
    if "episode_return" in metrics:
        axes.plot(
            x,
            metrics["episode_return"],
            color="C0",
            lw=2,
            marker="o" if len(x) <= 20 else None,
            ms=3,
            label="training episodes (mean)",
        )
    if "episode_return_min" in metrics and "episode_return_max" in metrics:
        axes.fill_between(
            x,
            metrics["episode_return_min"],
            metrics["episode_return_max"],
            color="C0",
            alpha=0.15,
            label="training episodes (min-max)",
        )
    scored = [p for p in evaluations if p.mean_return is not None]
    if scored:
        axes.errorbar(
            [p.env_steps for p in scored],
            [p.mean_return for p in scored],
            yerr=[p.std_return for p in scored],
            fmt="o",
            color="C1",
            capsize=3,
            label="evaluation (mean +- std)",
        )
    axes.set_title("episode return")
    axes.set_xlabel("env steps")
    axes.set_ylabel("return")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")


def draw_success(axes, evaluations: list[EvalPoint], confidence: float) -> None:
    """Evaluation success rate k / c with its Wilson band."""
    points = [p for p in evaluations if p.successes is not None and p.completed > 0]
    xs = np.array([p.env_steps for p in points])
    rates = np.array([p.successes / p.completed for p in points])
    low = np.array([p.interval[0] for p in points])
    high = np.array([p.interval[1] for p in points])
    axes.fill_between(xs, low, high, color="C2", alpha=0.25, label=f"{100 * confidence:g}% Wilson interval")
    axes.plot(xs, rates, "o-", color="C2", label="success k / c")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title("evaluation success rate")
    axes.set_xlabel("env steps")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")


def draw_times(axes, x: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
    """Seconds per iteration, stacked by phase (collection, update, evaluation, checkpoint)."""
    present = [k for k in TIMES if k in metrics]
    if not present:
        axes.text(0.5, 0.5, "no timing in this run", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        return
    axes.stackplot(x, *[np.nan_to_num(metrics[k]) for k in present], labels=[k[5:] for k in present], alpha=0.8)
    axes.set_title("seconds per iteration")
    axes.set_xlabel("env steps")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
