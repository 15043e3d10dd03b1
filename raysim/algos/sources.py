"""Where an algorithm's training samples come from, behind one small interface: ``sample(size, generator)``.

- ``Dataset``: a fixed batch (a dataset of demonstrations: BC's steps, RLPD's transitions), drawn in shuffled passes
  (without replacement within a pass), where the pass stands being part of the algorithm's state;
- ``raysim.algos.replay.ReplayBuffer``: the transitions the shards collected (SAC's), which each update fills
  (``chunk_transitions``), drawn uniformly with replacement.

PPO and GRPO draw nothing: each update's chunks are their batch, taken whole in epochs (``raysim.algos.epochs``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from raysim.algos.epochs import Batch, select


class Source(Protocol):
    def sample(self, size: int, generator: torch.Generator) -> Batch:
        """``size`` samples (copies), drawn with ``generator``."""
        ...


class Dataset:
    """A fixed ``batch`` (nested tensors of ``size`` rows) drawn in shuffled passes."""

    def __init__(self, batch: Batch):
        self.batch = batch
        self.size = int(next(iter(_leaves(batch))).shape[0])
        self.order = torch.zeros(0, dtype=torch.int64)  # the current pass, and where it stands
        self.position = 0

    def indices(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """The rows of the next ``size`` samples: passes over the dataset in shuffled order."""
        taken = []
        while size > 0:
            if self.position >= self.order.numel():
                self.order, self.position = torch.randperm(self.size, generator=generator), 0
            part = self.order[self.position : self.position + size]
            self.position += part.numel()
            size -= part.numel()
            taken.append(part)
        return torch.cat(taken)

    def sample(self, size: int, generator: torch.Generator) -> Batch:
        return select(self.batch, self.indices(size, generator))

    def state_dict(self) -> dict[str, Any]:
        """Where the current pass stands (a checkpoint's: a resume draws what the run would have drawn)."""
        return {"order": self.order.clone(), "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order, self.position = torch.as_tensor(state["order"]), int(state["position"])


def _leaves(batch: Batch) -> list[torch.Tensor]:
    return [t for v in batch.values() for t in (_leaves(v) if isinstance(v, dict) else [v])]
