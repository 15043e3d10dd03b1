"""``ReplayBuffer``: the transitions an off-policy algorithm samples from, held on the learner (SAC's own state).

Each valid env step of a chunk becomes one transition (``chunk_transitions``): the observation groups the
networks read, the action, the reward, the next observation and whether the episode terminated there. The
next observation is the real one: ``obs[t+1]`` for a row that went on, the chunk's owned ``final_obs`` for a row
whose episode ended at ``t``; a terminated row never bootstraps from it (``terminated``), a truncated one does.
Masked steps (a native vector env's reset transitions, rows dropped for a non-finite value) are not transitions.

Transition ``i`` of the run (counted from 0 on this learner rank) lives in slot ``i mod capacity``, so the
buffer's layout follows from the transitions alone: a buffer rebuilt from the saved transitions (``restore``)
samples exactly what the uninterrupted one would. First in, first out at capacity. Observations keep their
dtypes (uint8 images stay uint8) and their group names.
"""

from __future__ import annotations

from typing import Any

import torch

from raysim.algos.epochs import Batch, select
from raysim.rollout import RolloutChunk

#: a batch of transitions: ``obs`` and ``next_obs`` ({group: [B, ...]}), ``actions`` [B, ...], ``reward`` [B],
#: ``terminated`` [B] bool
Transitions = dict[str, Any]


def chunk_transitions(chunk: RolloutChunk, groups: list[str]) -> Transitions:
    """The valid env steps of ``chunk`` as transitions (copies, never views of the object store), in the chunk's
    (step, row) order; ``groups``: the observation groups kept."""
    next_obs = {g: chunk.obs[g][1:].clone() for g in groups}  # [T, N, ...]
    if chunk.final_t.numel():
        for g in groups:  # an episode that ended at t: its own final observation, not the next episode's first
            next_obs[g][chunk.final_t, chunk.final_row] = chunk.final_obs[g].to(next_obs[g].dtype)
    mask = chunk.mask
    return {
        "obs": {g: chunk.obs[g][:-1][mask] for g in groups},
        "next_obs": {g: v[mask] for g, v in next_obs.items()},
        "actions": chunk.actions[mask],
        "reward": chunk.reward[mask].float(),
        "terminated": chunk.terminated[mask],
    }


def concat_transitions(parts: list[Transitions]) -> Transitions:
    """Batches of transitions one after the other (one batch: itself, not copied)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    return {
        k: {g: torch.cat([p[k][g] for p in parts]) for g in first[k]}
        if isinstance(first[k], dict)
        else torch.cat([p[k] for p in parts])
        for k in first
    }


def size_of(transitions: Transitions) -> int:
    """How many transitions a batch holds."""
    return int(transitions["reward"].shape[0])


def transition_bytes(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], action: tuple[int, ...]) -> int:
    """The bytes one transition takes in a buffer: its observation groups twice (``shapes``: group -> (shape,
    dtype)), a float32 action of shape ``action``, the reward and the termination flag."""
    obs = sum(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in shapes.values())
    return 2 * obs + 4 * torch.Size(action).numel() + 4 + 1


class ReplayBuffer:
    """``capacity`` transitions in preallocated tensors; ``added``: the transitions ever added (the next one's
    index). The tensors are allocated at the first ``add``, from its shapes and dtypes."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"replay.capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.added = 0
        self.storage: Transitions | None = None

    @property
    def size(self) -> int:
        """The transitions held now."""
        return min(self.added, self.capacity)

    def add(self, transitions: Transitions) -> None:
        """Append ``transitions`` (the oldest are overwritten once the buffer is full)."""
        count = size_of(transitions)
        if count == 0:
            return
        if self.storage is None:
            self.storage = _allocate(transitions, self.capacity)
        keep = min(count, self.capacity)  # more than capacity at once: only the newest can stay
        first = self.added + count - keep
        slots = torch.arange(first, first + keep) % self.capacity
        _write(self.storage, slots, select(transitions, torch.arange(count - keep, count)))
        self.added += count

    def restore(self, segments: list[tuple[int, Transitions]]) -> None:
        """Refill from saved ``(first index, transitions)`` segments, in order (each follows the one before; those
        that left the buffer may be omitted): the buffer as it was when the last one was added."""
        self.added, self.storage = 0, None
        for first, transitions in segments:
            self.added = first
            self.add(transitions)

    def sample(self, size: int, generator: torch.Generator) -> Batch:
        """``size`` transitions drawn uniformly with replacement from those held (copies)."""
        if self.storage is None or self.size == 0:
            raise ValueError("the replay buffer is empty: nothing to sample")
        slots = torch.randint(self.size, (size,), generator=generator)
        return select(self.storage, slots)


def _allocate(example: Transitions, capacity: int) -> Transitions:
    """Empty tensors for ``capacity`` transitions shaped and typed as ``example``'s."""

    def like(value: torch.Tensor) -> torch.Tensor:
        return torch.empty((capacity, *value.shape[1:]), dtype=value.dtype)

    return {
        k: {g: like(v) for g, v in value.items()} if isinstance(value, dict) else like(value)
        for k, value in example.items()
    }


def _write(storage: Transitions, slots: torch.Tensor, transitions: Transitions) -> None:
    """``transitions`` into ``storage`` at ``slots``."""
    for key, value in transitions.items():
        if isinstance(value, dict):
            for group, tensor in value.items():
                storage[key][group][slots] = tensor
        else:
            storage[key][slots] = value
