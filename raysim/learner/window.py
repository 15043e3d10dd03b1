"""The learner's metrics between two log steps: tensors on its device, reduced and copied to the host once.

``MetricWindow`` accumulates each update's metrics and the episode sums of its chunks without a
host copy; ``Learner.metrics`` stacks them (``vector``), reduces them across ranks in one
collective and copies the result to the host once (``to_host``); ``episode_stats`` turns the sums
into means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from raysim.rollout import RolloutChunk


@dataclass
class MetricNames:
    """The layout of a stacked metric vector: the means' weighted totals and their weights, then sums, then min
    and max return."""

    means: list[str]
    sums: list[str]


class MetricWindow:
    """The update metrics and episode sums of the iterations since the last log step (tensors).

    Adding an iteration's metrics only queues device additions: nothing is copied to the host
    until ``Learner.metrics`` reduces the window. Each update's metrics weigh with its transitions
    (``totals``: weighted sums, ``counts``: the weights), so a mean over updates and ranks of unequal
    batches (GRPO's rounds, elastic shards) is the mean over their transitions.
    """

    SUMS = (
        "episodes",
        "return_sum",
        "length_sum",
        "success_sum",
        "env_steps_trained",
        "groups_played",
        "groups_dropped",
        "groups_filled",
    )

    def __init__(self):
        self.totals: dict[str, torch.Tensor] = {}
        self.counts: dict[str, float] = {}
        self.sums: dict[str, torch.Tensor] = {}
        self.low = torch.tensor(math.inf)
        self.high = torch.tensor(-math.inf)

    def add(self, metrics: dict[str, torch.Tensor], sums: dict[str, torch.Tensor], weight: float = 1.0) -> None:
        """An update's ``metrics`` (means over its ``weight`` transitions) and its chunks' episode ``sums``."""
        for name, value in metrics.items():
            value = value.detach().float() * weight
            self.totals[name] = self.totals[name] + value if name in self.totals else value
            self.counts[name] = self.counts.get(name, 0) + weight
        extremes = sums.pop("extremes")
        for name, value in sums.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.low = torch.minimum(self.low, extremes[0])
        self.high = torch.maximum(self.high, extremes[1])

    def state_dict(self) -> dict[str, Any]:
        """The window as plain data (tensors, ints) for a checkpoint: a resumed run's next row covers it too."""
        return {"totals": self.totals, "counts": self.counts, "sums": self.sums, "low": self.low, "high": self.high}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, device: torch.device) -> MetricWindow:
        """A window from ``state_dict`` (the update metrics on ``device``, the episode sums on the CPU, where
        ``add`` keeps them); none (a checkpoint older than saved windows): an empty one."""
        window = cls()
        if state:
            window.totals = {k: v.to(device) for k, v in state["totals"].items()}
            window.counts = dict(state["counts"])
            window.sums = dict(state["sums"])
            window.low, window.high = state["low"], state["high"]
        return window

    def vector(self, device: torch.device) -> tuple[MetricNames, torch.Tensor]:
        """``[weighted totals..., their weights..., sums..., min return, max return]`` stacked on ``device``."""
        means = sorted(self.totals)
        zero = torch.tensor(0.0)
        parts = [self.totals[n].to(device) for n in means]
        parts += [torch.tensor(float(self.counts[n])).to(device) for n in means]
        parts += [self.sums.get(n, zero).to(device) for n in self.SUMS]
        parts += [self.low.to(device), self.high.to(device)]
        return MetricNames(means, list(self.SUMS)), torch.stack([p.reshape(()) for p in parts])


def reduce_gathered(names: MetricNames, gathered: torch.Tensor) -> torch.Tensor:
    """Every rank's stacked vector [R, M] reduced: ``[means..., sums..., min, max]``, each mean over every rank's
    transitions (a rank of a larger batch weighs more), sums of the sums, min and max."""
    means, sums = len(names.means), len(names.sums)
    totals, weights = gathered[:, :means].sum(0), gathered[:, means : 2 * means].sum(0)
    return torch.cat(
        [
            totals / weights,
            gathered[:, 2 * means : 2 * means + sums].sum(0),
            gathered[:, -2:-1].amin(0),
            gathered[:, -1:].amax(0),
        ]
    )


def to_host(vector: torch.Tensor) -> list[float]:
    """The one device-to-host copy of a log step's reduced metrics (a test counts its calls)."""
    return vector.tolist()


def episode_sums(chunks: list[RolloutChunk]) -> dict[str, torch.Tensor]:
    """Sums over the episodes completed in these chunks (to reduce across ranks).

    ``extremes``: the lowest and highest episode return (+inf, -inf when none ended).
    """
    columns = {
        k: torch.cat([c.episodes[k].float().cpu() for c in chunks if k in c.episodes] or [torch.zeros(0)])
        for k in ("return", "length", "success")
    }
    count = columns["return"].numel()
    has_success = columns["success"].numel() == count  # also when no episode ended here
    returns = columns["return"]
    return {
        "episodes": torch.tensor(float(count)),
        "return_sum": returns.sum(),
        "length_sum": columns["length"].sum(),
        "success_sum": columns["success"].sum() if has_success else torch.tensor(float("nan")),
        "extremes": torch.stack([returns.min(), returns.max()]) if count else torch.tensor([math.inf, -math.inf]),
    }


def sampling_sums(chunks: list[RolloutChunk], trained: int) -> dict[str, torch.Tensor]:
    """``env_steps_trained``, the transitions of the first ``trained`` chunks (the others arrived past the lag bound
    and were not trained on), and GRPO's dynamic sampling counts over all of them (``RolloutChunk.groups_played``)."""

    def total(values) -> torch.Tensor:
        return torch.tensor(float(sum(values)))

    return {
        "env_steps_trained": total(c.transitions for c in chunks[:trained]),
        "groups_played": total(c.groups_played for c in chunks),
        "groups_dropped": total(c.groups_dropped for c in chunks),
        "groups_filled": total(c.groups_filled for c in chunks),
    }


def sampling_stats(sums: dict[str, float]) -> dict[str, float]:
    """Dynamic sampling's metrics from ``sampling_sums`` (after the reduction), where it played groups (else none):
    ``env_steps_trained`` since the last log step (``env_steps`` counts every step played), ``groups_dropped`` the
    fraction of the groups played that were left out, ``groups_filled`` the fraction of those kept that were
    uninformative, taken because ``algo.max_rounds`` ran out."""
    played = sums.get("groups_played", 0.0)
    if not played:
        return {}
    kept = played - sums["groups_dropped"]
    return {
        "env_steps_trained": sums["env_steps_trained"],
        "groups_dropped": sums["groups_dropped"] / played,
        "groups_filled": sums["groups_filled"] / kept,
    }


def episode_stats(sums: dict[str, float], low: float = math.nan, high: float = math.nan) -> dict[str, float]:
    """Mean return, length (and success rate) from ``episode_sums`` (after the reduction).

    ``episodes``: the episodes that ended since the last log step (over all ranks); their lowest
    and highest return as ``episode_return_min`` / ``episode_return_max``.
    """
    count = sums["episodes"]
    stats = {"episodes": count}
    if count:
        stats["episode_return"] = sums["return_sum"] / count
        stats["episode_length"] = sums["length_sum"] / count
        stats["episode_return_min"], stats["episode_return_max"] = low, high
        if sums["success_sum"] == sums["success_sum"]:  # not NaN: every episode reported success
            stats["success_rate"] = sums["success_sum"] / count
    return stats
