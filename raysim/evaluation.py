"""Evaluation: episodes 0..n-1 by global index over every row of every evaluation shard, with denominators.

Evaluation episode ``j`` is played by row ``j mod E`` of the E rows of all evaluation shards, each row's
episodes in index order, so row ``r`` has the quota ``n // E``, plus one for the first ``n % E`` rows.
Everything random about episode ``j`` (its reset seed, a stochastic evaluation's action noise, the
task's observation noise) derives from ``(seed, j)``, and the actor computes each row alone
(``raysim.models.rowwise``), so the records of episode ``j`` (return, length, success) and the report do
not depend on the number of shards, their rows or timing; a record's ``row`` and ``step`` are the
layout's. An env with several tasks (``raysim/MetaWorld``) plays task ``j mod K`` in episode ``j`` (row
``r`` plays task ``r mod K``, and every shard's rows are a multiple of K): the report then also holds
each task's rates, and the unweighted mean of the per-task success rates (each task counts the same,
whatever its episodes), the benchmark's figure; a record carries its task's name. ``balanced: false``
(the first ``n`` to finish) depends on the layout by nature. The report holds the requested ``n``,
completed ``c`` and successful ``k`` episodes (``k`` wherever the task defines success, also when no
episode completed), the rates with Wilson score intervals, and return and length statistics over the
completed episodes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

from raysim.actors import Backend, Handle, InputLost
from raysim.config import EvalConfig
from raysim.recording import Film, film_on_shards
from raysim.records import records_table
from raysim.rollout import EnvShard, EvalEpisodes, Scoring
from raysim.storage import write_parquet


def quotas(episodes: int, rows: int) -> list[int]:
    """Per-row quotas: ``episodes // rows``, plus one for the first ``episodes % rows`` rows (row ``r``
    plays episodes ``r, r + rows, ...`` below ``episodes``)."""
    if rows < 1:
        raise ValueError("evaluation needs at least one row")
    base, extra = divmod(int(episodes), rows)
    return [base + (1 if r < extra else 0) for r in range(rows)]


def wilson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes / trials``; None when ``trials`` is 0."""
    if trials <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Rate:
    """A rate with its Wilson interval (``value`` and ``interval`` None when the denominator is 0)."""

    numerator: int
    denominator: int
    value: float | None
    interval: tuple[float, float] | None

    @classmethod
    def of(cls, numerator: int, denominator: int, confidence: float) -> Rate:
        value = numerator / denominator if denominator else None
        return cls(numerator, denominator, value, wilson(numerator, denominator, confidence))


@dataclass
class TaskReport:
    """One task's share of a multi-task evaluation: its episodes requested, completed and successful."""

    requested: int
    completed: int
    success_rate: Rate | None  # k / c (None when the task defines no success)
    mean_return: float | None


@dataclass
class EvalReport:
    """What an evaluation found: denominators, rates, and return / length statistics."""

    requested: int  # n
    completed: int  # c
    successes: int | None  # k (None when the task defines no success)
    confidence: float
    completion_rate: Rate  # c / n
    success_rate: Rate | None  # k / c
    success_per_requested: Rate | None  # k / n
    returns: dict[str, float | None]  # mean, std, min, max over completed episodes
    lengths: dict[str, float | None]
    records: list[dict] = field(default_factory=list, repr=False)
    excluded: int = 0  # counted episodes left out: the env gave a non-finite value (``env.on_nonfinite: mask``)
    tasks: dict[str, TaskReport] = field(default_factory=dict)  # by task name, in the env's order; {}: one task

    @property
    def mean_return(self) -> float | None:
        return self.returns["mean"]

    @property
    def mean_task_success(self) -> float | None:
        """The unweighted mean over tasks of their success rates k / c (None: one task, no success, or a task
        with no completed episode)."""
        rates = [task.success_rate.value if task.success_rate else None for task in self.tasks.values()]
        return statistics.fmean(rates) if rates and None not in rates else None


def summarize(
    records: list[dict],
    requested: int,
    confidence: float = 0.95,
    excluded: int = 0,
    scoring: Scoring | None = None,
) -> EvalReport:
    """An ``EvalReport`` from the counted episode records; ``excluded``: episodes already left out.

    ``scoring.defines_success``: whether the task defines success (``BatchedEnv.defines_success``), so
    that with no completed episode k/n is still 0/n and k/c undefined; None (or no ``scoring``): the
    records tell (success in every one of them, at least one). ``scoring.task_names``: the env's tasks,
    reported one by one (episode ``j`` plays task ``j mod K``). A record whose return is not finite is
    left out too (and counted in ``excluded``): the statistics are over finite returns only.
    """
    defines_success = scoring.defines_success if scoring is not None else None
    finite = [r for r in records if math.isfinite(float(r["return"]))]
    excluded += len(records) - len(finite)
    records = finite
    completed = len(records)
    has_success = defines_success
    if has_success is None:
        has_success = completed > 0 and all("success" in r for r in records)
    successes = sum(bool(r.get("success")) for r in records) if has_success else None
    return EvalReport(
        requested=requested,
        completed=completed,
        successes=successes,
        confidence=confidence,
        completion_rate=Rate.of(completed, requested, confidence),
        success_rate=Rate.of(successes, completed, confidence) if has_success else None,
        success_per_requested=Rate.of(successes, requested, confidence) if has_success else None,
        returns=_stats([float(r["return"]) for r in records]),
        lengths=_stats([float(r["length"]) for r in records]),
        records=records,
        excluded=excluded,
        tasks=per_task(records, requested, scoring.task_names if scoring else (), has_success, confidence),
    )


def per_task(
    records: list[dict], requested: int, task_names: tuple[str, ...], has_success: bool, confidence: float
) -> dict[str, TaskReport]:
    """Each task's episodes (requested: the indices ``j < requested`` with ``j mod K`` its index); {} for one task."""
    if len(task_names) < 2:
        return {}
    K = len(task_names)
    tasks = {}
    for k, name in enumerate(task_names):
        mine = [r for r in records if r.get("task") == name]
        successes = sum(bool(r.get("success")) for r in mine)
        tasks[name] = TaskReport(
            requested=len(range(k, requested, K)),
            completed=len(mine),
            success_rate=Rate.of(successes, len(mine), confidence) if has_success else None,
            mean_return=statistics.fmean(float(r["return"]) for r in mine) if mine else None,
        )
    return tasks


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


@dataclass
class EvalSpec:
    """What to evaluate: how many episodes, from which seed, how they are counted."""

    episodes: int
    seed: int
    max_steps: int  # steps an episode may take: one still running then is cut and not completed
    deterministic: bool = True
    balanced: bool = True  # False: plain "first n to finish" (biased toward short episodes)
    confidence: float = 0.95
    policy: str | None = None  # None: the actor of the weights; expert, random: scripted (raysim.rollout.policies)
    trajectories: bool = False  # each record also carries its episode's steps (demonstrations: raysim.demos)

    @classmethod
    def of(cls, config: EvalConfig, max_episode_steps: int | None) -> EvalSpec:
        """The evaluation ``config`` asks for; the default step budget is the env's episode limit (or 1000)."""
        max_steps = config.max_steps or max_episode_steps or 1000
        return cls(config.episodes, config.seed, max_steps, config.deterministic, config.balanced, config.confidence)


def evaluate_on_shards(
    backend: Backend,
    make_shard: Callable[[int], Handle],
    shards: list[Handle],
    rows_per_shard: list[int],
    weights: object,
    spec: EvalSpec,
    on_scored_episode: Callable[[dict], None] | None = None,
    on_episode: Callable[[dict], None] | None = None,
    max_restarts: int = 3,
    film: Film | None = None,
) -> EvalReport:
    """Run episodes ``0..spec.episodes-1`` over the shards' rows (``EvalEpisodes``) and summarize them.

    A shard whose process dies is replaced (``make_shard(i)``, also written into ``shards``) and
    its rows play their episodes again by index, so the report equals that of a run without the
    fault. The callbacks see each counted episode once, in index order. ``film``: the evaluation is
    also filmed into its video (``raysim.recording``), with the same records. ``weights``: None for a
    scripted ``spec.policy``.
    """
    rows = sum(rows_per_shard)
    row_quotas = quotas(spec.episodes, rows) if spec.balanced else [spec.episodes] * rows
    stop_after = None if spec.balanced else spec.episodes
    offsets = [sum(rows_per_shard[:i]) for i in range(len(shards))]
    plans = [
        EvalEpisodes(
            row_quotas[offsets[i] : offsets[i] + rows_per_shard[i]],
            offsets[i],
            spec.seed,
            spec.max_steps,
            spec.deterministic,
            stop_after,
            rows,
            spec.policy,
            spec.trajectories,
        )
        for i in range(len(shards))
    ]
    if film is not None:
        played = film_on_shards(backend, make_shard, shards, plans, weights, film, max_restarts)
    else:
        played = play_on_shards(backend, make_shard, shards, plans, weights, max_restarts)
    results, excluded, scoring = played
    if not spec.balanced:  # the first episodes to finish, over all shards
        results = sorted(results, key=lambda pair: (pair[0]["step"], pair[0]["row"]))[: spec.episodes]
    results.sort(key=lambda pair: pair[0]["episode"])
    for record, report in results:
        if on_scored_episode is not None:
            on_scored_episode(dict(record))
        if on_episode is not None:
            on_episode(report)
    return summarize([record for record, _ in results], spec.episodes, spec.confidence, excluded, scoring)


def play_on_shards(
    backend: Backend,
    make_shard: Callable[[int], Handle],
    shards: list[Handle],
    plans: list[EvalEpisodes],
    weights: object,
    max_restarts: int = 3,
) -> tuple[list[tuple[dict, dict]], int, Scoring | None]:
    """Play ``plans`` on ``shards`` (one each, all at once; a dead shard replaced and its plan played again):
    the counted ``(record, report)`` pairs, the episodes left out and how the task counts them."""
    pending = {i: shards[i].call(EnvShard.evaluate, weights, plans[i]) for i in range(len(shards))}
    results: list[tuple[dict, dict]] = []
    restarts, excluded, scoring = 0, 0, None
    while pending:
        i, future = pending.popitem()
        try:
            counted, left_out, scoring = backend.get(future)
            results += counted
            excluded += left_out
        except Exception as error:
            if not backend.is_actor_failure(error) or restarts >= max_restarts:
                raise
            if backend.alive(shards[i], EnvShard.spaces):  # the shard is fine: its input, the weights, is lost
                raise InputLost(f"evaluation shard {i} could not read the policy's weights: {error}") from error
            restarts += 1
            print(
                f"evaluation shard {i} died ({type(error).__name__}); replacing it and replaying its rows", flush=True
            )
            shards[i] = make_shard(i)
            pending[i] = shards[i].call(EnvShard.evaluate, weights, plans[i])
    return results, excluded, scoring


def write_records(path: str | Path, records: list[dict]) -> None:
    """Write episode records to a local Parquet file (atomically: a temporary file, then rename)."""
    write_parquet(path, records_table(records))


def format_rate(r: Rate | None) -> str:
    """``k/n = rate  [low, high]``, or why there is none."""
    if r is None:
        return "n/a (the task defines no success)"
    if r.value is None:
        return f"{r.numerator}/{r.denominator}  undefined (no denominator)"
    lo, hi = r.interval
    return f"{r.numerator}/{r.denominator} = {r.value:.3f}  [{lo:.3f}, {hi:.3f}]"


def format_tasks(report: EvalReport) -> list[str]:
    """The per-task lines of a multi-task evaluation and their unweighted mean; none for one task."""
    if not report.tasks:
        return []
    K = len(report.tasks)
    width = max(len(name) for name in report.tasks)
    lines = [f"per task ({K} tasks, episode j plays task j mod {K}), success k / c:"]
    for name, task in report.tasks.items():
        mean = "n/a" if task.mean_return is None else f"{task.mean_return:.1f}"
        lines.append(f"  {name:<{width}}  {format_rate(task.success_rate)}  return {mean}")
    mean_success = report.mean_task_success
    lines.append(
        f"mean over tasks        {'n/a' if mean_success is None else f'{mean_success:.3f}'}"
        "  (unweighted mean of the per-task rates: each task counts the same)"
    )
    return lines


def format_report(report: EvalReport) -> str:
    """A readable table of an evaluation report."""
    rate = format_rate

    def stats(s: dict) -> str:
        if s["mean"] is None:
            return "n/a (no completed episode)"
        return f"{s['mean']:.2f} +- {s['std']:.2f}  (min {s['min']:.2f}, max {s['max']:.2f})"

    level = f"{100 * report.confidence:g}% Wilson"
    lines = [
        f"requested episodes n   {report.requested}",
        f"completed c / n        {rate(report.completion_rate)}   {level}",
        f"success k / c          {rate(report.success_rate)}",
        f"success k / n          {rate(report.success_per_requested)}",
        f"return                 {stats(report.returns)}",
        f"length                 {stats(report.lengths)}",
        *format_tasks(report),
    ]
    if report.excluded:
        lines.append(
            f"excluded               {report.excluded} episode(s) with non-finite values (env.on_nonfinite: mask)"
        )
    return "\n".join(lines)
