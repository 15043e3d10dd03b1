"""Distillation (DAgger, Ross et al. 2011), read top to bottom: config, loss, the algorithm.

A teacher trained on privileged state (another run: ``algo.teacher``) teaches a student that sees only what the
robot sees. The student acts (its own samples, or with probability ``beta`` per row and step the teacher's
action, ``beta`` falling linearly to 0 over ``beta_decay_steps`` env steps); the shard labels every step with
the teacher's output on the teacher's groups (``RolloutChunk.labels``, ``raysim.rollout.teacher``); the student
learns by regression on the labels at the states it visits. No critic, no rewards in the loss.

Loss: continuous actions, the squared error between the student's Gaussian mean and the teacher's, both before
the action transform (``action_error``: through the tanh, between the actions the env receives, for a ``squash``
student, as behaviour cloning takes it); a teacher of another ``model.action_transform`` than the student's is
distilled in the actions the env receives (its label is the mean whose student transform gives the teacher's env
action: ``raysim.rollout.teacher``). The log-std is not trained: the student's exploration stays
``model.init_log_std``.
Discrete actions, the cross-entropy from the teacher's action probabilities to the student's.

The teacher is read once by the driver, copied into the run (``raysim.coordinator.teacher``) and sent to each
shard once, when it is created.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.algos.base import Algorithm
from raysim.algos.bc import action_error
from raysim.algos.epochs import Batch, concat, transition_steps, transitions
from raysim.models import ActorCritic
from raysim.rollout import FixedSteps, RolloutChunk
from raysim.schema import setting


def _group_list(value: object) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return f"must be a list of observation group names ([]: the teacher's own names), got {value!r}"
    return None


@dataclass
class DistillConfig:
    """Distillation hyperparameters."""

    name: str = setting("distill", help="the algorithm")
    teacher: str = setting(
        "", help="the teacher's run directory or checkpoint (local or a URI): its actor labels every step"
    )
    teacher_inputs: list[str] = setting(
        factory=list,
        help="the student env's groups the teacher reads, one per group of its model.actor_inputs, in order "
        "([]: groups of the same names)",
        check=_group_list,
    )
    beta: float = setting(
        0.0, help="probability that a row's action at a step is the teacher's (DAgger's beta)", low=0, high=1
    )
    beta_decay_steps: int = setting(0, help="env steps over which beta falls linearly to 0 (0: constant)", low=0)
    num_steps: int = setting(32, help="steps per shard per iteration (the chunk length T)", low=1)
    lr: float = setting(1e-3, help="Adam's learning rate", low=0, open_low=True)
    lr_schedule: str = setting(
        "constant", help="linear: to 0 at train.total_steps, on the env steps consumed", choices=("constant", "linear")
    )
    update_epochs: int = setting(4, help="passes over each iteration's batch", low=1)
    num_minibatches: int = setting(4, help="minibatches per pass", low=1)
    max_grad_norm: float = setting(1.0, help="global gradient-norm clip", low=0, open_low=True)
    max_nonfinite_updates: int = setting(3, help="consecutive skipped minibatches before training stops", low=1)
    max_policy_lag: int = setting(
        0, help="policy versions a chunk may lag its update (labels do not depend on the acting policy)", low=0
    )


def distill_loss(model: ActorCritic, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation loss of one minibatch (the student's output against the teacher's labels) and its metrics."""
    actor, labels = model.actor, batch["labels"]
    out = actor(batch["obs"])
    if actor.discrete:
        teacher_probs = labels.softmax(-1)
        loss = -(teacher_probs * out.log_softmax(-1)).sum(-1).mean()
        agreement = (out.argmax(-1) == labels.argmax(-1)).float().mean()
        return loss, {"distill_loss": loss, "agreement": agreement.detach()}
    loss = action_error(actor, actor.mean_of(out), labels)
    return loss, {"distill_loss": loss}


class Distill(Algorithm):
    """DAgger: regression of the student's actor on the teacher's labels at the states the student visits."""

    name = "distill"
    Config = DistillConfig
    uses_critic = False
    loss_terms = ("distill_loss",)

    @classmethod
    def collection(cls, config: DistillConfig) -> FixedSteps:
        return FixedSteps(config.num_steps, config.beta)

    @classmethod
    def collection_at(cls, config: DistillConfig, env_steps: int) -> FixedSteps:
        """``beta`` after ``env_steps`` consumed env steps: constant, or linearly to 0 at ``beta_decay_steps``."""
        beta = config.beta
        if config.beta_decay_steps:
            beta *= max(0.0, 1.0 - env_steps / config.beta_decay_steps)
        return FixedSteps(config.num_steps, beta)

    @classmethod
    def check(cls, config: DistillConfig, num_envs: int) -> None:
        if not config.teacher:
            raise ValueError(
                "algo.teacher must name the teacher's run directory (train one first, e.g. raysim train reach_ppo)"
            )

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        """Every valid transition's observations and the teacher's label."""
        parts = []
        for chunk in chunks:
            if chunk.labels is None:
                raise ValueError(f"a chunk of shard {chunk.shard} has no teacher labels: its shard has no teacher")
            part = transitions(chunk)
            part["labels"] = transition_steps(chunk, chunk.labels)
            parts.append(part)
        return concat(parts)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return distill_loss(self.model, minibatch)
