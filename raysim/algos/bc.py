"""Behaviour cloning, read top to bottom: config, loss, the algorithm that trains on a dataset.

BC is an algorithm on the learner like PPO and GRPO (same interface, same checkpoints), so it runs where
the learner runs (a GPU when there is one), but it has no training shards (``collection`` is None): the
driver reads the dataset of demonstrations once (``raysim.demos``) and hands it to every learner rank
through the object store; each rank trains on its share (``Demonstrations.split``). The budget is in
gradient steps (``algo.updates``, exactly): one iteration is ``update_epochs`` passes over ``num_minibatches``
minibatches, and the last one takes the steps that remain, each on its own minibatch; evaluation, metrics
rows and checkpoints come every iteration as in any run.

The observation normalizer (``model.obs_norm``) is fitted once, from every step of the dataset, before
the first update, and then stays fixed. The default loss on continuous actions is the squared error of
the Gaussian's mean (a likelihood would shrink the log-std without bound on a deterministic expert);
``loss: nll`` trains the log-std too. The dataset's actions are read as the policy samples them, before
``model.action_transform`` (the reader maps an expert's env actions back through it). With ``squash`` the
squared error is taken through the tanh, in the action space: the executed action then estimates the
demonstrated one's mean as a clipped mean does (a squared error of atanh'd targets would average where the
expert is near a bound in the tanh's far tail, and pull toward the bounds); the nll is of the atanh'd targets,
the squashed distribution's log-likelihood up to a constant. Discrete actions: cross-entropy on the logits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from raysim.algos.base import Algorithm, Collectives
from raysim.algos.epochs import Batch, run_epochs
from raysim.algos.guard import GuardedStep
from raysim.algos.sources import Dataset
from raysim.models import Actor, ActorCritic
from raysim.models.normalizer import moments
from raysim.rollout import RolloutChunk
from raysim.schema import setting


@dataclass
class BCConfig:
    """Behaviour-cloning hyperparameters."""

    name: str = setting("bc", help="the algorithm")
    dataset: str = setting(
        "", help="a Minari dataset id (under MINARI_DATASETS_PATH) or a dataset directory (raysim demos record)"
    )
    updates: int = setting(
        4000, help="gradient steps in all, exactly: the run's budget (train.total_steps is not read)", low=1
    )
    batch_size: int = setting(256, help="samples per gradient step", low=1)
    loss: str = setting(
        "mse",
        help="continuous actions: squared error of the mean, or the Gaussian's negative log-likelihood "
        "(discrete actions: cross-entropy either way)",
        choices=("mse", "nll"),
    )
    lr: float = setting(1e-3, help="Adam's learning rate", low=0, open_low=True)
    lr_schedule: str = setting(
        "constant", help="the learning rate's schedule (BC has no env steps)", choices=("constant",)
    )
    update_epochs: int = setting(1, help="passes over each iteration's minibatches", low=1)
    num_minibatches: int = setting(
        100,
        help="minibatches per iteration (one metrics row, one evaluation): num_minibatches x update_epochs gradient "
        "steps; the last iteration takes the steps that remain of updates",
        low=1,
    )
    max_grad_norm: float = setting(10.0, help="global gradient-norm clip", low=0, open_low=True)
    max_nonfinite_updates: int = setting(3, help="consecutive skipped minibatches before training stops", low=1)
    max_policy_lag: int = setting(0, help="not used: BC collects nothing", low=0, high=0)


def steps_per_iteration(config: BCConfig) -> int:
    """The gradient steps of a full iteration."""
    return config.num_minibatches * config.update_epochs


def action_error(actor: Actor, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean squared error of a Gaussian actor's means ``out`` against ``target`` (both before the action
    transform): of the means themselves (clip), or through the tanh, between the actions the env receives, in units
    of half the range (squash), so that the executed action estimates the target's mean as a clipped mean does (a
    squared error before the tanh averages in its far tail and pulls toward the bounds). BC's and distillation's."""
    if actor.squash:
        return (torch.tanh(out) - torch.tanh(target)).square().mean()
    return (out - target).square().mean()


def bc_loss(model: ActorCritic, batch: Batch, config: BCConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The behaviour-cloning loss of one minibatch and its metrics."""
    actor = model.actor
    out = actor(batch["obs"])
    if actor.discrete:
        loss = torch.nn.functional.cross_entropy(out, batch["actions"].long())
        accuracy = (out.argmax(-1) == batch["actions"]).float().mean()
        return loss, {"bc_loss": loss, "accuracy": accuracy.detach()}
    error = action_error(actor, actor.mean_of(out), batch["actions"])
    if config.loss == "nll":
        loss = -actor.log_prob_entropy_of(out, batch["actions"])[0].mean()
    else:
        loss = error
    return loss, {"bc_loss": loss, "action_mse": error.detach()}


class BC(Algorithm):
    """Behaviour cloning on this rank's share of a dataset; no shards, no critic."""

    name = "bc"
    Config = BCConfig
    uses_critic = False
    loss_terms = ("bc_loss",)

    def __init__(self, config: BCConfig, model: ActorCritic, ranks: Collectives):
        super().__init__(config, model, ranks)
        self.demos: Dataset | None = None  # this rank's share of the dataset (``attach``), drawn in passes

    @classmethod
    def collection(cls, config: BCConfig) -> None:
        return None

    @classmethod
    def planned_iterations(cls, config: BCConfig) -> int:
        return max(1, math.ceil(config.updates / steps_per_iteration(config)))

    @classmethod
    def check(cls, config: BCConfig, num_envs: int) -> None:
        if not config.dataset:
            raise ValueError("algo.dataset must name a dataset of demonstrations (raysim demos record makes one)")

    @classmethod
    def dataset(cls, config: BCConfig) -> tuple[str, str]:
        return "algo.dataset", config.dataset

    def attach(self, demonstrations: Any) -> None:
        """Fit the observation normalizers on the whole dataset (the same on every rank), keep this rank's share."""
        for network in (self.model.actor, self.model.critic):
            if network is not None and network.obs_norm is not None:
                features = network.vector_input({g: demonstrations.obs[g] for g in network.vector_groups})
                network.obs_norm.merge(moments(features.to(network.obs_norm.mean.device)))
        share = demonstrations.split(self.ranks.rank, self.ranks.world_size)
        self.demos = Dataset({"obs": share.obs, "actions": share.actions})

    def update(
        self, chunks: list[RolloutChunk], step: GuardedStep, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """One iteration: ``num_minibatches x batch_size`` samples of the share, ``update_epochs`` passes over them;
        the last (``version``: the iterations done) the steps that remain of ``updates``, one pass."""
        if chunks:
            raise ValueError("algo 'bc' trains on its dataset, not on rollout chunks")
        if self.demos is None:
            raise ValueError("algo 'bc' was given no dataset (Learner(demonstrations=...))")
        config, per_iteration = self.config, steps_per_iteration(self.config)
        remaining = config.updates - self.version * per_iteration
        if remaining < per_iteration:
            config = dataclasses.replace(config, num_minibatches=max(1, remaining), update_epochs=1)
        batch = self.demos.sample(config.num_minibatches * config.batch_size, generator)
        device = self.ranks.device
        batch = {"obs": {g: v.to(device) for g, v in batch["obs"].items()}, "actions": batch["actions"].to(device)}
        return run_epochs(self.loss, self.loss_terms, step, batch, config, generator)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return bc_loss(self.model, minibatch, self.config)

    def state_dict(self) -> dict:
        drawn = self.demos.state_dict() if self.demos is not None else {"order": torch.zeros(0), "position": 0}
        return {"bc_order": drawn["order"], "bc_position": drawn["position"]}

    def load_state_dict(self, state: dict) -> None:
        if "bc_order" in state and self.demos is not None:
            self.demos.load_state_dict({"order": state["bc_order"], "position": state["bc_position"]})
