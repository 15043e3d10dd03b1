"""``Collectives``: what an algorithm and its optimizer step may ask of the learner's ranks.

Implemented by ``raysim.learner.ranks.RankGroup`` (one torch.distributed group); with one rank
every call is a no-op on the local values, so the algorithms run unchanged in-process.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``local`` (same shape on all ranks, on ``device``), in rank order."""
        ...

    def all_reduce(self, flat: torch.Tensor) -> None:
        """Sum ``flat`` over the ranks, in place."""
        ...

    def agree(self, what: str, error: BaseException | None) -> None:
        """Every rank's outcome of a step that can fail on one rank only (``error``: this rank's, or None), before
        the next collective: if any failed, every rank raises the same error naming them (none waits alone)."""
        ...
