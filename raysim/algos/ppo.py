"""PPO (Schulman et al. 2017), read top to bottom: config, clipped objective, advantages, loss.

Names follow CleanRL's ppo.py, and the metrics carry the same names as the variables
(``pg_loss``, ``v_loss``, ``entropy``, ``approx_kl``, ``clipfrac``, ...). The learner calls
``PPO.update`` (``raysim.algos.base``): advantages by GAE with the terminal-value bootstrap
(``raysim.rollout.advantages``), then ``update_epochs`` epochs of ``num_minibatches`` minibatches.

With ``max_policy_lag > 0`` chunks may have been collected by an older policy than the learner's: the
update is then *decoupled PPO* (``raysim.algos.decoupled``, shared with GRPO): the ratio is taken to the
learner's own policy at the start of the update and each sample weighted by the truncated importance
weight. A chunk collected by the learner's current policy (every chunk in lockstep) is plain PPO.

Fine-tuning a pretrained actor (``model.init_from``) has two guards, off by default: a critic warm-up
(``critic_warmup_steps``: value-only updates while the new critic learns the pretrained policy's values)
and a KL pull toward the pretrained actor (``kl_coef``, decaying over ``kl_decay_steps``: the mechanism of
GRPO's KL penalty, ``raysim.algos.reference``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raysim.algos.base import Algorithm, Collectives
from raysim.algos.decoupled import decouple, importance_weighted
from raysim.algos.epochs import (
    Batch,
    concat,
    sequence_steps,
    sequences,
    transition_steps,
    transitions,
    valid_steps,
)
from raysim.algos.guard import GuardedStep
from raysim.algos.reference import Reference, reference_of
from raysim.algos.reward_scale import RewardScale
from raysim.models import ActorCritic
from raysim.rollout import FixedSteps, RolloutChunk
from raysim.rollout.advantages import chunk_values, gae, sequence_values
from raysim.schema import setting


@dataclass
class PPOConfig:
    """PPO hyperparameters (CleanRL's names and defaults unless noted)."""

    name: str = setting("ppo", help="the algorithm")
    num_steps: int = setting(32, help="steps per shard per iteration (the chunk length T)", low=1)
    gamma: float = setting(0.99, help="discount", low=0, high=1)
    gae_lambda: float = setting(0.95, help="GAE's lambda", low=0, high=1)
    lr: float = setting(3e-4, help="Adam's learning rate", low=0, open_low=True)
    lr_schedule: str = setting(
        "constant", help="linear: to 0 at train.total_steps, on the env steps consumed", choices=("constant", "linear")
    )
    update_epochs: int = setting(4, help="passes over each iteration's batch", low=1)
    num_minibatches: int = setting(4, help="minibatches per pass", low=1)
    clip_coef: float = setting(0.2, help="the ratio's clip range epsilon", low=0, high=1, open_low=True, open_high=True)
    clip_vloss: bool = setting(False, help="clip the value loss as the ratio")
    vf_coef: float = setting(0.5, help="weight of the value loss", low=0)
    ent_coef: float = setting(0.0, help="weight of the entropy bonus", low=0)
    norm_adv: bool = setting(True, help="normalize the advantages per minibatch")
    max_grad_norm: float = setting(0.5, help="global gradient-norm clip", low=0, open_low=True)
    # CleanRL's rule: after each epoch, stop the update if the approx_kl of the epoch's last minibatch
    # exceeds it (over learner ranks: the sample-weighted mean, so all ranks stop together); None: off
    target_kl: float | None = setting(
        None,
        help="stop after an epoch whose last minibatch's approx_kl exceeds it (CleanRL's rule)",
        low=0,
        open_low=True,
    )
    max_nonfinite_updates: int = setting(3, help="consecutive skipped minibatches before training stops", low=1)
    reward_scale: bool = setting(False, help="divide rewards by the running std of the discounted return")
    max_policy_lag: int = setting(
        0, help="policy versions a chunk may lag its update (0: lockstep; 1: collect during the update)", low=0
    )
    # a lagging chunk (decoupled PPO): the ratio is clipped around the learner's policy at the update's start,
    # and each sample weighted by that policy's probability over the acting policy's, truncated here
    max_is_weight: float = setting(2.0, help="truncation of a lagging chunk's importance weight (decoupled PPO)", low=1)
    # fine-tuning guards (model.init_from); the defaults leave plain PPO
    critic_warmup_steps: int = setting(
        0, help="first env steps of value-only updates: the actor and the observation statistics frozen", low=0
    )
    kl_coef: float = setting(
        0.0, help="KL pull toward the actor the run started from (model.init_from; 0: none)", low=0
    )
    kl_decay_steps: int = setting(0, help="env steps over which kl_coef falls linearly to 0 (0: constant)", low=0)


def clipped_objective(logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO's clipped surrogate ``min(r A, clip(r, 1-eps, 1+eps) A)`` per sample, in log space.

    For ``A >= 0`` the classic form equals ``A * min(r, 1+eps)``, for ``A < 0`` it equals
    ``A * max(r, 1-eps)``. Comparing the log-ratio with ``log(1+eps)`` or ``log(1-eps)`` before
    exponentiating gives the same objective and gradients wherever the classic form is finite,
    and stays finite where the classic one overflows although the objective is bounded: a huge
    ratio with ``A > 0`` (classic: inf * 0 gradient paths) or ``A = 0`` (classic: inf * 0 = NaN).
    With ``A < 0`` and a huge ratio the objective ``A * r`` is unbounded below by definition: it
    becomes -inf here too, and the update's non-finite guard skips that minibatch.
    At an exact tie ``log r == log(1 +- eps)`` the unclipped branch is taken, so the gradient is
    ``A * r``, as in the classic form (whose clamp passes the gradient at its bounds).
    """
    positive = advantages >= 0
    # the bounds in the log-ratio's dtype (Python scalars alone would give float32 bounds)
    bound = torch.where(
        positive, logratio.new_tensor(math.log1p(clip_coef)), logratio.new_tensor(math.log1p(-clip_coef))
    )
    inside = torch.where(positive, logratio <= bound, logratio >= bound)
    return advantages * torch.exp(torch.where(inside, logratio, bound))


def ratio_metrics(logratio: torch.Tensor, clip_coef: float) -> dict[str, torch.Tensor]:
    """``approx_kl`` (the k3 estimator, as CleanRL) and ``clipfrac`` of a minibatch's log-ratios."""
    with torch.no_grad():
        ratio = logratio.exp()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return {"approx_kl": approx_kl, "clipfrac": clipfrac}


def ppo_loss(
    model: ActorCritic, batch: Batch, config: PPOConfig, reference: Reference | None = None, kl_weight: float = 0.0
) -> tuple[torch.Tensor, dict]:
    """The PPO loss of one minibatch and its metrics (tensors, still on the device); with a ``reference``, plus
    ``kl_weight`` times the KL to it (fine-tuning's pull toward the pretrained actor)."""
    # one forward of each network (a CNN the critic shares with the actor, model.shared_encoders: once for both;
    # a recurrent core replays the minibatch's sequences once for both, model.recurrent)
    newlogprob, entropy, newvalue = model.evaluate(batch["obs"], batch["actions"], batch.get("sequences"))
    kl = torch.zeros((), device=newlogprob.device)
    if reference is not None:
        kl = reference.kl(batch["obs"], batch["actions"], newlogprob)  # feed-forward: no sequences
    batch = valid_steps(batch)  # a recurrent model's: the steps of its sequences that are not padding, flat
    logratio = newlogprob - batch["logprobs"]

    advantages = batch["advantages"]
    if config.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    objective = importance_weighted(clipped_objective(logratio, advantages, config.clip_coef), batch)
    pg_loss = -objective.mean()

    if config.clip_vloss:
        v_clipped = batch["values"] + (newvalue - batch["values"]).clamp(-config.clip_coef, config.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - batch["returns"]).square(), (v_clipped - batch["returns"]).square()).mean()
    else:
        v_loss = 0.5 * (newvalue - batch["returns"]).square().mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + config.vf_coef * v_loss + kl_weight * kl
    metrics = {
        "pg_loss": pg_loss,
        "v_loss": v_loss,
        "entropy": entropy_loss,
        **({"kl": kl} if reference is not None else {}),
        **ratio_metrics(logratio, config.clip_coef),
    }
    return loss, metrics


class PPO(Algorithm):
    """PPO with GAE advantages bootstrapped by the critic; optional reward scaling (``reward_scale``)."""

    name = "ppo"
    Config = PPOConfig
    trains_recurrent = True
    loss_terms = ("pg_loss", "v_loss", "entropy")

    def __init__(self, config: PPOConfig, model: ActorCritic, ranks: Collectives):
        super().__init__(config, model, ranks)
        self.reward_scale = RewardScale(config.gamma) if config.reward_scale else None
        self.reference = reference_of(model.actor, config)  # the actor as loaded: model.init_from's when set

    def warming_up(self) -> bool:
        """The critic's warm-up (``critic_warmup_steps``): value-only updates, the actor and its inputs' statistics
        frozen, so a pretrained actor is not moved by advantages from an untrained critic."""
        return self.env_steps < self.config.critic_warmup_steps

    def freezes_normalizer(self) -> bool:
        return self.warming_up()

    @classmethod
    def collection(cls, config: PPOConfig) -> FixedSteps:
        return FixedSteps(config.num_steps)

    def update(
        self, chunks: list[RolloutChunk], step: GuardedStep, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        if self.reward_scale is not None:  # before the advantages, which divide by its std
            self.reward_scale.observe(chunks, self.ranks)
        warming = self.warming_up()
        self.model.actor.requires_grad_(not warming)  # no gradient: the optimizer leaves the actor as it is
        try:
            metrics = super().update(chunks, step, generator)
        finally:
            self.model.actor.requires_grad_(True)
        metrics["actor_frozen"] = torch.tensor(float(warming), device=self.ranks.device)
        return metrics

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        """Values, GAE advantages and returns (advantages + values) of every valid transition; for a recurrent
        model, of every row's sequence (``sequence_values``: the core's outputs the shard stored, replayed for a chunk
        of an older policy)."""
        recurrent = self.model.actor.core is not None
        parts = []
        for chunk in chunks:
            if recurrent:
                part, steps = sequences(chunk), sequence_steps
                values, next_values = sequence_values(self.model, chunk, chunk.policy_version == self.version)
            else:
                part, steps = transitions(chunk), transition_steps
                values, next_values = chunk_values(self.model.critic, chunk)
            done = chunk.terminated | chunk.truncated
            reward = chunk.reward if self.reward_scale is None else self.reward_scale.scale(chunk.reward)
            advantages = gae(reward, values, next_values, done, chunk.mask, self.config.gamma, self.config.gae_lambda)
            part.update(
                returns=steps(chunk, advantages + values),
                values=steps(chunk, values),
                advantages=steps(chunk, advantages),
            )
            parts.append(part)
        decouple(parts, chunks, self.version, self.model.actor, self.config.max_is_weight)  # max_policy_lag > 0
        return concat(parts)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weight = self.reference.weight(self.env_steps) if self.reference is not None else 0.0
        return ppo_loss(self.model, minibatch, self.config, self.reference, weight)

    def state_dict(self) -> dict:
        state = {"reward_scale": self.reward_scale.state_dict()} if self.reward_scale is not None else {}
        if self.reference is not None:
            state["reference"] = self.reference.actor.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.reward_scale is not None and "reward_scale" in state:
            self.reward_scale.load_state_dict(state["reward_scale"])
        if self.reference is not None and "reference" in state:
            self.reference.actor.load_state_dict(state["reference"])
