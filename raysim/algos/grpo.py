"""GRPO (Shao et al. 2024), read top to bottom: config, group advantages, loss.

Critic-free: groups of ``group_size`` rows start from the same reset seed and each plays one
episode (``raysim.rollout.GroupEpisodes``). A member's advantage is its episode return normalized
within its group, ``(R - mean) / (std + eps)``, or only centred, ``R - mean``, with
``std_normalize: false`` (Dr. GRPO, Liu et al. 2025). Every step of the episode gets its member's
advantage. The actor objective is PPO's ``clipped_objective`` (imported, not copied), plus an
optional KL penalty toward a frozen copy of the initial actor (``raysim.algos.reference``: the pretrained
one when the run starts from ``model.init_from``, its weight decaying with ``kl_decay_steps``) and an
entropy bonus.

A truncated episode (the env's step limit, or ``num_steps`` of the round) counts with its return
so far: there is no critic, so nothing is bootstrapped.

With ``max_policy_lag > 0`` a round may have been played by an older policy than the learner's: it is
trained as PPO trains a lagging chunk, decoupled (``raysim.algos.decoupled``): the ratio around the
learner's policy at the start of the update, each sample weighted by the truncated importance weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.algos.base import Algorithm, Collectives
from raysim.algos.decoupled import decouple, importance_weighted
from raysim.algos.epochs import Batch, concat, transitions
from raysim.algos.ppo import clipped_objective, ratio_metrics
from raysim.algos.reference import Reference, reference_of
from raysim.models import Actor, ActorCritic
from raysim.rollout import GroupEpisodes, RolloutChunk
from raysim.schema import setting


@dataclass
class GRPOConfig:
    """GRPO hyperparameters."""

    name: str = setting("grpo", help="the algorithm")
    group_size: int = setting(8, help="rows per group; must divide env.num_envs", low=2)
    num_steps: int = setting(500, help="step limit of a round (a round ends when every row finished)", low=1)
    lr: float = setting(3e-4, help="Adam's learning rate", low=0, open_low=True)
    lr_schedule: str = setting(
        "constant", help="linear: to 0 at train.total_steps, on the env steps consumed", choices=("constant", "linear")
    )
    update_epochs: int = setting(4, help="passes over each round's batch", low=1)
    num_minibatches: int = setting(4, help="minibatches per pass", low=1)
    clip_coef: float = setting(0.2, help="the ratio's clip range epsilon", low=0, high=1, open_low=True, open_high=True)
    ent_coef: float = setting(0.0, help="weight of the entropy bonus", low=0)
    kl_coef: float = setting(
        0.0, help="KL penalty toward the frozen initial actor (model.init_from's, when set; 0: none)", low=0
    )
    kl_decay_steps: int = setting(0, help="env steps over which kl_coef falls linearly to 0 (0: constant)", low=0)
    std_normalize: bool = setting(True, help="divide by the group's std (false: Dr. GRPO, centred only)")
    max_grad_norm: float = setting(0.5, help="global gradient-norm clip", low=0, open_low=True)
    max_nonfinite_updates: int = setting(3, help="consecutive skipped minibatches before training stops", low=1)
    max_policy_lag: int = setting(
        0, help="policy versions a chunk may lag its update (0: lockstep; 1: collect during the update)", low=0
    )
    max_is_weight: float = setting(2.0, help="truncation of a lagging chunk's importance weight (decoupled PPO)", low=1)
    groups_per_shard: int | None = setting(
        None,
        help="dynamic sampling: each shard plays rounds until it holds this many groups whose returns are not all "
        "equal, and trains on exactly those (null: off, one round of every group)",
        low=1,
    )
    max_rounds: int = setting(
        8,
        help="dynamic sampling: the most rounds a shard plays per iteration (short of groups: uninformative ones fill)",
        low=1,
    )


def group_advantages(
    returns: torch.Tensor, group_size: int, std_normalize: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Group-relative advantages [N] of the episode returns [N] (rows ``[gG, (g+1)G)`` form group g).

    ``(R - mean) / (std + eps)`` with the group's (unbiased) std, or ``R - mean`` when not
    ``std_normalize``. A group whose returns are all equal gets exactly zero advantages.
    """
    grouped = returns.reshape(-1, group_size).to(torch.float64)
    centred = grouped - grouped.mean(1, keepdim=True)
    if std_normalize:
        centred = centred / (grouped.std(1, keepdim=True) + eps)
    equal = (grouped == grouped[:, :1]).all(1, keepdim=True)
    return torch.where(equal, 0.0, centred).reshape(-1).to(returns.dtype)


def chunk_advantages(chunk: RolloutChunk, config: GRPOConfig) -> torch.Tensor:
    """Advantages [T, N]: every step of a row's episode gets the row's group advantage."""
    returns = torch.zeros(chunk.num_envs, dtype=chunk.reward.dtype, device=chunk.reward.device)
    rows = chunk.episodes["row"]
    here = rows >= 0  # dynamic sampling reports the episodes of the groups it left out with row -1
    returns[rows[here]] = chunk.episodes["return"][here].to(returns)
    advantages = group_advantages(returns, config.group_size, config.std_normalize)
    return advantages.expand(chunk.num_steps, -1)


def grpo_loss(
    actor: Actor, batch: Batch, config: GRPOConfig, reference: Reference | None, kl_weight: float
) -> tuple[torch.Tensor, dict]:
    """The GRPO loss of one minibatch and its metrics (tensors, still on the device); ``kl_weight``: the KL
    penalty's weight now (``Reference.weight``)."""
    newlogprob, entropy = actor.log_prob_entropy(batch["obs"], batch["actions"])
    logratio = newlogprob - batch["logprobs"]

    pg_loss = -importance_weighted(clipped_objective(logratio, batch["advantages"], config.clip_coef), batch).mean()

    kl = torch.zeros((), device=newlogprob.device)
    if reference is not None:
        kl = reference.kl(batch["obs"], batch["actions"], newlogprob)

    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + kl_weight * kl
    metrics = {"pg_loss": pg_loss, "kl": kl, "entropy": entropy_loss, **ratio_metrics(logratio, config.clip_coef)}
    return loss, metrics


class GRPO(Algorithm):
    """GRPO: no critic, no value inference; a frozen copy of the initial actor as KL reference (``kl_coef > 0``)."""

    name = "grpo"
    Config = GRPOConfig
    uses_critic = False
    loss_terms = ("pg_loss", "kl", "entropy")

    def __init__(self, config: GRPOConfig, model: ActorCritic, ranks: Collectives):
        super().__init__(config, model, ranks)
        self.reference = reference_of(model.actor, config)  # the actor as loaded: model.init_from's when set

    @classmethod
    def collection(cls, config: GRPOConfig) -> GroupEpisodes:
        return GroupEpisodes(config.group_size, config.num_steps, config.groups_per_shard, config.max_rounds)

    @classmethod
    def check(cls, config: GRPOConfig, num_envs: int) -> None:
        size = config.group_size
        if not isinstance(size, int) or size < 2 or num_envs % size:
            raise ValueError(
                f"algo.group_size must be an integer >= 2 that divides env.num_envs ({num_envs}), got {size!r}"
            )
        wanted = config.groups_per_shard
        if wanted is not None and wanted > num_envs // size:
            raise ValueError(
                f"algo.groups_per_shard ({wanted}) must be at most the groups of a round, env.num_envs / "
                f"algo.group_size ({num_envs // size})"
            )
        if wanted is not None and config.max_policy_lag > 0:
            raise ValueError(
                "algo.groups_per_shard (dynamic sampling) runs lockstep only: set algo.max_policy_lag: 0 "
                f"(got {config.max_policy_lag})"
            )

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        """Every valid transition with its member's group advantage (decoupled where a round lags)."""
        parts = []
        for chunk in chunks:
            part = transitions(chunk)
            part["advantages"] = chunk_advantages(chunk, self.config)[chunk.mask]
            parts.append(part)
        decouple(parts, chunks, self.version, self.model.actor, self.config.max_is_weight)  # max_policy_lag > 0
        return concat(parts)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weight = self.reference.weight(self.env_steps) if self.reference is not None else 0.0
        return grpo_loss(self.model.actor, minibatch, self.config, self.reference, weight)

    def state_dict(self) -> dict:
        return {"reference": self.reference.actor.state_dict()} if self.reference is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.reference is not None and "reference" in state:
            self.reference.actor.load_state_dict(state["reference"])
