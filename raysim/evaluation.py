"""Evaluation: quota-balanced episodes over every row of every evaluation shard, with denominators.

``episodes`` requested over E rows get quotas fixed before the start: ``episodes // E`` each, plus
one for the first ``episodes % E`` rows. Seeds derive from ``(seed, global row, episode index)``,
so the report does not depend on the shard layout or on timing. The report holds the requested
``n``, completed ``c`` and successful ``k`` episodes, the rates with Wilson score intervals, and
return and length statistics over the completed episodes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from statistics import NormalDist

from raysim.actors import Backend, Handle


def quotas(episodes: int, rows: int) -> list[int]:
    """Per-row quotas: ``episodes // rows``, plus one for the first ``episodes % rows`` rows."""
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
    def of(cls, numerator: int, denominator: int, confidence: float) -> "Rate":
        value = numerator / denominator if denominator else None
        return cls(numerator, denominator, value, wilson(numerator, denominator, confidence))


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

    @property
    def mean_return(self) -> float | None:
        return self.returns["mean"]


def summarize(records: list[dict], requested: int, confidence: float = 0.95) -> EvalReport:
    """An ``EvalReport`` from the counted episode records."""
    completed = len(records)
    has_success = completed > 0 and all("success" in r for r in records)
    successes = sum(bool(r["success"]) for r in records) if has_success else None
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
    )


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


def evaluate_on_shards(
    backend: Backend,
    shards: list[Handle],
    rows_per_shard: list[int],
    weights: object,
    episodes: int,
    seed: int,
    max_steps: int,
    deterministic: bool = True,
    confidence: float = 0.95,
) -> EvalReport:
    """Run ``episodes`` balanced episodes over the shards' rows and summarize them."""
    row_quotas = quotas(episodes, sum(rows_per_shard))
    calls, offset = [], 0
    for shard, rows in zip(shards, rows_per_shard):
        calls.append(shard.call("evaluate", weights, row_quotas[offset : offset + rows], offset, seed, max_steps, deterministic))
        offset += rows
    records = [r for part in backend.get(calls) for r in part]
    records.sort(key=lambda r: (r["row"], r["episode"]))
    return summarize(records, episodes, confidence)
