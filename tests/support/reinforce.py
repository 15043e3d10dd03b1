"""A third algorithm as a test fixture: REINFORCE with a mean-return baseline, in one file.

Named ``tests.support.reinforce:Reinforce`` in a config (``algo.name``), it trains through the same
learner and coordinator as PPO and GRPO: neither names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.algos.base import Algorithm
from raysim.algos.epochs import Batch, concat, transitions
from raysim.rollout import FixedSteps, RolloutChunk


@dataclass
class ReinforceConfig:
    name: str = "tests.support.reinforce:Reinforce"
    num_steps: int = 64
    gamma: float = 0.99
    lr: float = 1e-2
    lr_schedule: str = "constant"
    update_epochs: int = 1
    num_minibatches: int = 1
    max_grad_norm: float = 0.5
    max_nonfinite_updates: int = 3
    max_policy_lag: int = 0


def returns_to_go(chunk: RolloutChunk, gamma: float) -> torch.Tensor:
    """Discounted returns [T, N] from each step to the end of its episode or of the chunk (no bootstrap)."""
    returns = torch.zeros_like(chunk.reward)
    running = torch.zeros_like(chunk.reward[0])
    done = chunk.terminated | chunk.truncated
    for t in range(chunk.num_steps - 1, -1, -1):
        running = torch.where(done[t], 0.0, running) * gamma + chunk.reward[t]
        returns[t] = running
    return returns


class Reinforce(Algorithm):
    name = "reinforce"
    Config = ReinforceConfig
    uses_critic = False
    loss_terms = ("pg_loss",)

    @classmethod
    def collection(cls, config: ReinforceConfig) -> FixedSteps:
        return FixedSteps(config.num_steps)

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        parts = []
        for chunk in chunks:
            part = transitions(chunk)
            part["returns"] = returns_to_go(chunk, self.config.gamma)[chunk.mask]
            parts.append(part)
        return concat(parts)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprob, entropy = self.model.actor.log_prob_entropy(minibatch["obs"]["policy"], minibatch["actions"])
        advantages = minibatch["returns"] - minibatch["returns"].mean()  # the baseline: the batch's mean return
        pg_loss = -(logprob * advantages).mean()
        return pg_loss, {"pg_loss": pg_loss, "entropy": entropy.mean()}
