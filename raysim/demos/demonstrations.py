"""``Demonstrations``: the steps of a dataset's episodes as the policy sees them, ready for the learner.

The driver reads a dataset once (``raysim.demos.dataset.load_demonstrations``) and hands the result to every
learner rank through the object store (plain tensors); each rank trains on its ``split``. A dataset keeps each
observation as the env gave it; a frame stack is rebuilt here, per episode (``stack_episode``), as the shard's
``FrameStack`` stacks while acting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Demonstrations:
    """``S`` demonstrated steps: ``obs`` ``{group: [S, ...]}`` as the policy sees them (frame stack rebuilt, uint8
    images kept), ``actions`` [S, ...] as the policy samples them (float32 for a Box: before
    ``model.action_transform``; int64 for a Discrete), ``episode`` [S] int64 (each step's episode in the dataset),
    ``episodes`` (how many episodes the steps come from) and the dataset's raysim ``metadata`` (``raysim demos
    record``: env, identity, policy, seed; empty for a dataset made elsewhere)."""

    obs: dict[str, torch.Tensor]
    actions: torch.Tensor
    episode: torch.Tensor
    episodes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    # with ``load_demonstrations(..., transitions=True)`` (RLPD): each step's next observation (the real one at an
    # episode's end), reward and whether the episode terminated there
    next_obs: dict[str, torch.Tensor] | None = None
    reward: torch.Tensor | None = None
    terminated: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return int(self.actions.shape[0])

    def split(self, rank: int, world_size: int) -> Demonstrations:
        """Rank ``rank``'s share of ``world_size``: the steps ``rank, rank + world_size, ...`` (round-robin over
        steps, so the shares differ in size by one step at most, whatever the episodes' lengths)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        index = torch.arange(rank, self.steps, world_size)
        episode = self.episode[index]

        def part(value: Any) -> Any:
            if value is None:
                return None
            return {g: v[index] for g, v in value.items()} if isinstance(value, dict) else value[index]

        return Demonstrations(
            part(self.obs),
            part(self.actions),
            episode,
            int(episode.unique().numel()),
            self.metadata,
            part(self.next_obs),
            part(self.reward),
            part(self.terminated),
        )

    def transitions(self, groups: list[str]) -> dict[str, Any]:
        """The steps as an off-policy algorithm's transitions (``raysim.algos.replay``) of the groups ``groups``;
        a ``ValueError`` when they were loaded without (``transitions=True``)."""
        if self.next_obs is None:
            raise ValueError("these demonstrations were loaded without their transitions (transitions=True)")
        return {
            "obs": {g: self.obs[g] for g in groups},
            "next_obs": {g: self.next_obs[g] for g in groups},
            "actions": self.actions,
            "reward": self.reward,
            "terminated": self.terminated,
        }


def stack_episode(frames: torch.Tensor, k: int, axis: int) -> torch.Tensor:
    """The stacks ``[L, ...]`` a policy sees over one episode's observations ``frames`` [L, ...]: step ``t``'s is
    frames ``t-k+1 .. t``, oldest first, concatenated along the observation's ``axis`` (``stack_axis``), the
    episode's first observation repeated before it (``FrameStack``'s padding)."""
    steps = frames.shape[0]
    index = (torch.arange(steps).unsqueeze(1) + torch.arange(1 - k, 1)).clamp(min=0)  # [L, k]: t-k+1 .. t
    axis = axis % (frames.dim() - 1)
    return frames[index].movedim(1, 1 + axis).flatten(1 + axis, 2 + axis)
