"""``RunningNorm``: running mean and variance of a network's vector input, applied as a normalization.

With ``model.obs_norm: true`` the actor and the critic each hold a ``RunningNorm`` of the vector
groups they read (``raysim.models.inputs``; images are scaled inside their CNN instead) as a
submodule, so its buffers ``mean``, ``var`` (population variance) and ``count`` travel with the
weights: the actor's state_dict that the shards load, the model's state_dict in checkpoints. The
forward is

    clamp((x - mean) / sqrt(var + epsilon), -clip, clip)

The statistics change only in ``Learner.update``, after the algorithm's update (which reads the
statistics the actors acted with), from the valid observations of the training chunks (never from
evaluation, terminal-value inference or the shards). Batches are merged with
the parallel-variance formula (``combine``, Chan et al.); with several learner ranks every rank
combines every rank's batch statistics in rank order (``merge_across_ranks``), so all ranks hold
identical statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

EPSILON = 1e-8


def moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(count, mean, population var)`` of a batch ``x`` [B, D], in float64."""
    x = x.detach().to(torch.float64)
    count = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
    if x.shape[0] == 0:
        return count, x.new_zeros(x.shape[1]), x.new_zeros(x.shape[1])
    mean = x.mean(0)
    return count, mean, (x - mean).square().mean(0)


def combine(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(count, mean, var)`` of the union of two sets from their own (parallel variance).

    ``n = na + nb``, ``mean = ma + d * nb / n``, ``var = (va * na + vb * nb + d^2 * na * nb / n) / n``
    with ``d = mb - ma``; a side with count 0 leaves the other unchanged.
    """
    na, ma, va = (t.to(torch.float64) for t in a)
    nb, mb, vb = (t.to(torch.float64) for t in b)
    n = na + nb
    if float(n) == 0:
        return n, ma, va
    delta = mb - ma
    mean = ma + delta * (nb / n)
    var = (va * na + vb * nb + delta.square() * (na * nb / n)) / n
    return n, mean, var


class RunningNorm(nn.Module):
    """Running statistics of ``dim`` features and the clipped normalization by them."""

    def __init__(self, dim: int, clip: float = 10.0, epsilon: float = EPSILON):
        super().__init__()
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def std(self) -> torch.Tensor:
        """``sqrt(var + epsilon)``: the divisor of the forward (and of the fused inference path)."""
        return torch.sqrt(self.var + self.epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((x - self.mean) / self.std(), -self.clip, self.clip)

    def stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.count, self.mean, self.var

    @torch.no_grad()
    def merge(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Merge batch statistics ``(count, mean, var)`` into the running ones (in place)."""
        count, mean, var = combine(self.stats(), batch)
        self.count.copy_(count)
        self.mean.copy_(mean.to(self.mean.dtype))
        self.var.copy_(var.to(self.var.dtype))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the statistics of a batch ``x`` [B, dim] (rows flattened to features)."""
        self.merge(moments(x.flatten(1)))

    def extra_repr(self) -> str:
        return f"{self.mean.numel()}, clip={self.clip}, epsilon={self.epsilon}"


Moments = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (count, mean [D], population var [D])


def merge_across_ranks(
    batches: list[tuple[RunningNorm, Moments]],
    gather: Callable[[torch.Tensor], list[torch.Tensor]],
    device: torch.device,
) -> None:
    """Merge each rank's batch statistics into its running norm, combined over every rank in rank order.

    One all-gather (``gather``) of every norm's packed ``[count, mean, var]``; each rank then combines
    the ranks' statistics in rank order (float64) and merges the union into the norm, so all ranks
    hold identical statistics, those of one pass over the union of their batches.
    """
    local = torch.cat([torch.cat([count.reshape(1), mean, var]).to(device) for _, (count, mean, var) in batches])
    parts = gather(local)
    offset = 0
    for norm, (_, mean, _) in batches:
        dim = mean.numel()
        merged = None
        for part in parts:  # in rank order
            stats = (part[offset], part[offset + 1 : offset + 1 + dim], part[offset + 1 + dim : offset + 1 + 2 * dim])
            merged = stats if merged is None else combine(merged, stats)
        norm.merge(tuple(x.to(norm.count.device) for x in merged))
        offset += 1 + 2 * dim
