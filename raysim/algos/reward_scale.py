"""``RewardScale``: rewards divided by the running standard deviation of the discounted return.

As Stable-Baselines3's ``VecNormalize(norm_reward=True)`` and CleanRL's ``NormalizeReward``: each
row keeps a discounted return ``G = gamma * G + r`` (reset at its episode ends), the running
variance of ``G`` over the valid transitions of the training chunks is tracked, and the learner
computes advantages from ``clamp(r / sqrt(var + eps), -clip, clip)``. The chunk's reward itself
(what is logged) is never modified. Each shard's rows have their own accumulators, carried from
one chunk to the next (by the chunk's shard index) and saved in checkpoints. An accumulator that no
chunk advanced in the last ``FORGET_AFTER`` updates is dropped: its shard is gone (elastic shards take
new indices as they come and go) or trains on another rank now, and would start afresh if it came back.
"""

from __future__ import annotations

import torch

from raysim.algos.collectives import Collectives
from raysim.models.normalizer import RunningNorm, combine, merge_across_ranks, moments
from raysim.rollout import RolloutChunk

FORGET_AFTER = 100  # updates without a chunk of a shard after which its accumulators are dropped


class RewardScale:
    """Running return statistics and per-shard return accumulators."""

    def __init__(self, gamma: float, clip: float = 10.0):
        self.gamma = gamma
        self.norm = RunningNorm(1, clip=clip)
        self.returns: dict[int, torch.Tensor] = {}  # shard index -> [N] discounted return so far
        self.updates = 0  # calls of observe
        self.advanced: dict[int, int] = {}  # shard index -> the update that last advanced its accumulators

    def observe(self, chunks: list[RolloutChunk], ranks: Collectives) -> None:
        """Merge the chunks' discounted returns, over every rank, into the running return statistics; drop the
        accumulators of shards with no chunk in the last ``FORGET_AFTER`` updates."""
        self.updates += 1
        batch = moments(torch.zeros(0, 1, dtype=torch.float64))
        for chunk in chunks:
            batch = combine(batch, self.batch_moments(chunk))
            self.advanced[chunk.shard] = self.updates
        for shard in [s for s in self.returns if self.updates - self.advanced.get(s, 0) >= FORGET_AFTER]:
            del self.returns[shard]
            self.advanced.pop(shard, None)
        merge_across_ranks([(self.norm, batch)], ranks.gather, ranks.device)

    def batch_moments(self, chunk: RolloutChunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advance the chunk's shard's accumulators through the chunk; the moments of its valid returns."""
        returns = self.returns.get(chunk.shard)
        if returns is None or chunk.fresh:  # a new (or replaced) shard's rows start fresh episodes
            returns = torch.zeros(chunk.num_envs, dtype=torch.float64)
        done = chunk.terminated | chunk.truncated
        seen = []
        for t in range(chunk.num_steps):
            valid = chunk.mask[t].cpu()
            returns = torch.where(valid, returns * self.gamma + chunk.reward[t].cpu().double(), 0.0)
            seen.append(returns[valid])
            returns = torch.where(done[t].cpu(), 0.0, returns)
        self.returns[chunk.shard] = returns
        return moments(torch.cat(seen).unsqueeze(1))

    def scale(self, reward: torch.Tensor) -> torch.Tensor:
        """The reward the advantages are computed from (a new tensor)."""
        std = self.norm.std().to(reward.device, reward.dtype)
        return torch.clamp(reward / std, -self.norm.clip, self.norm.clip)

    def state_dict(self) -> dict:
        return {
            "norm": self.norm.state_dict(),
            "returns": {str(k): v.clone() for k, v in self.returns.items()},
            "updates": self.updates,
            "advanced": {str(k): v for k, v in self.advanced.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state; one saved before accumulators were dropped counts each as advanced now."""
        self.norm.load_state_dict(state["norm"])
        self.returns = {int(k): v.clone() for k, v in state["returns"].items()}
        self.updates = int(state.get("updates", 0))
        advanced = {int(k): int(v) for k, v in state.get("advanced", {}).items()}
        self.advanced = {k: advanced.get(k, self.updates) for k in self.returns}
