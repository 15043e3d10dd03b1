"""SAC (Haarnoja et al. 2018), read top to bottom: config, the squashed actor's sample, the losses, the update.

Names follow CleanRL's ``sac_continuous_action.py`` (``qf_loss``, ``actor_loss``, ``alpha_loss``, ``alpha``), and its
settings are the defaults. Off-policy: the chunks the shards collect are appended to a replay buffer on the
learner (``raysim.algos.replay``, the learner's ``replay.capacity``), and each update runs ``updates_per_step``
gradient steps per new env step (the remainder carried to the next update), each on a batch sampled from it.

- The actor is the model's Gaussian with a per-state log-std (``model.log_std: state``), squashed by tanh
  (``model.action_transform: squash``): the critics read the squashed action ``y = tanh(u)`` in [-1, 1] (the env's
  action rescaled), the entropy carries tanh's log-determinant. The chunk stores ``u`` before the squash.
- The critics are ``critics`` Q networks in one batched module (``raysim.models.QEnsemble``), optionally with
  LayerNorm; the target is the minimum over a random ``critic_subset`` of their target networks (drawn from the
  learner's generator; all of them when the subset is the ensemble), updated by Polyak averaging (``tau``).
  The actor maximises the minimum (``actor_q: min``, classic SAC) or the mean (``mean``, RLPD) of the critics.
- The temperature ``alpha`` is learned toward ``target_entropy`` (default ``-dim(A)``), or fixed.
- The first ``learning_starts`` env steps act uniformly at random on the shards (``FixedSteps.random_actions``)
  and train nothing. A truncated episode bootstraps from its real final observation, a terminated one never.
- RLPD (Ball et al. 2023): with ``demonstrations`` (a dataset as BC reads it), ``demo_fraction`` of every batch
  comes from them (``raysim.algos.replay.chunk_transitions`` of the demonstrations), the rest from the buffer.

The critics, their targets, ``log_alpha`` and their optimizers are this algorithm's (its ``state_dict``); the
learner's optimizer covers the actor. The buffer itself is not in the state: the learner returns each update's
new transitions (``appended``) and the coordinator saves them beside the checkpoints (``restore`` refills it).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from raysim.algos.base import Algorithm, Collectives
from raysim.algos.epochs import Batch
from raysim.algos.guard import GuardedStep
from raysim.algos.replay import ReplayBuffer, Transitions, chunk_transitions, concat_transitions, size_of
from raysim.algos.sources import Dataset
from raysim.envs.spaces import is_image_space
from raysim.models import ActorCritic
from raysim.models.ensemble import QEnsemble
from raysim.models.inputs import critic_groups
from raysim.rollout import FixedSteps, RolloutChunk
from raysim.schema import setting


@dataclass
class SACConfig:
    """SAC hyperparameters (CleanRL's ``sac_continuous_action`` defaults)."""

    name: str = setting("sac", help="the algorithm")
    num_steps: int = setting(64, help="steps per shard per iteration (the chunk length T)", low=1)
    gamma: float = setting(0.99, help="discount", low=0, high=1)
    tau: float = setting(0.005, help="Polyak rate of the target critics", low=0, high=1, open_low=True)
    lr: float = setting(3e-4, help="the actor's learning rate (Adam)", low=0, open_low=True)
    q_lr: float = setting(1e-3, help="the critics' and the temperature's learning rate (Adam)", low=0, open_low=True)
    lr_schedule: str = setting("constant", help="the actor's learning rate schedule", choices=("constant", "linear"))
    batch_size: int = setting(256, help="transitions per gradient step (over every learner rank)", low=1)
    updates_per_step: float = setting(1.0, help="gradient steps per env step collected (the replay ratio)", low=0)
    learning_starts: int = setting(5000, help="first env steps of uniform random actions, without updates", low=0)
    policy_frequency: int = setting(
        2, help="the actor and alpha are updated every this many gradient steps, that many times (CleanRL's)", low=1
    )
    actor_warmup_steps: int = setting(
        0,
        help="first env steps in which only the critics learn (the actor and alpha stay as loaded: a pretrained "
        "actor, model.init_from, is not moved by critics that do not know its values yet)",
        low=0,
    )
    critics: int = setting(2, help="Q networks in the ensemble", low=1)
    critic_subset: int = setting(2, help="the target is the minimum over this many critics drawn at random", low=1)
    actor_q: str = setting(
        "min", help="what the actor maximises: the critics' minimum or mean", choices=("min", "mean")
    )
    layer_norm: bool = setting(False, help="LayerNorm after every hidden layer of the critics (RLPD)")
    alpha: float | None = setting(
        None,
        help="the entropy temperature: the initial one when learned (autotune), else fixed (null: CleanRL's, 1.0 when "
        "learned, its log-alpha starting at 0, and 0.2 when fixed)",
        low=0,
    )
    autotune: bool = setting(True, help="learn alpha toward target_entropy")
    backup_entropy: bool = setting(
        True, help="the critics' target includes the next action's entropy bonus (false: RLPD's option, sparse rewards)"
    )
    target_entropy: float | None = setting(None, help="the entropy alpha aims for (null: -dim(A))")
    demonstrations: str = setting("", help="RLPD: a dataset of demonstrations (as algo.dataset of bc); '' for none")
    bc_coef: float = setting(
        0.0,
        help="RLPD with a pull toward the demonstrations: the actor's loss adds this times the squared error "
        "between its mean action and the demonstrated one on the batch's demonstrated rows (TD3+BC's term)",
        low=0,
    )
    demo_fraction: float = setting(
        0.5, help="RLPD: the share of every batch drawn from the demonstrations", low=0, high=1
    )
    max_grad_norm: float = setting(
        1000.0, help="global gradient-norm clip of each network (CleanRL: none)", low=0, open_low=True
    )
    max_nonfinite_updates: int = setting(3, help="consecutive skipped gradient steps before training stops", low=1)
    max_policy_lag: int = setting(
        0, help="policy versions a chunk may lag its update (0: lockstep; 1: collect during the updates)", low=0
    )
    update_epochs: int = setting(1, help="not used: each gradient step samples its own batch", low=1, high=1)
    num_minibatches: int = setting(1, help="not used: each gradient step samples its own batch", low=1, high=1)


def squashed_sample(
    model: ActorCritic, obs: dict[str, torch.Tensor], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised action ``y = tanh(mean + std * eps)`` in [-1, 1] and its log-probability, tanh's
    log-determinant included (CleanRL's ``get_action``, in the unscaled [-1, 1] space)."""
    mean, log_std = model.actor.mean_log_std(model.actor(obs))
    std = log_std.exp()
    eps = torch.randn(mean.shape, generator=generator, device=mean.device)
    u = mean + std * eps
    y = torch.tanh(u)
    log_prob = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_prob = log_prob - torch.log(1 - y.square() + 1e-6).sum(-1)
    return y, log_prob


class SAC(Algorithm):
    """Soft actor-critic on a replay buffer; RLPD with demonstrations."""

    name = "sac"
    Config = SACConfig
    uses_critic = False  # its critics are its own: Q(s, a), not the model's V(s)
    off_policy = True
    loss_terms = ("qf_loss", "actor_loss")

    @classmethod
    def model_defaults(cls) -> dict[str, Any]:
        """Its own critics; the squashed Gaussian with a per-state log-std, starting at -1.5 (CleanRL's actor: its
        log-std head's output near 0 at the start is -1.5 in [-5, 2])."""
        return {"critic": False, "action_transform": "squash", "log_std": "state", "init_log_std": -1.5}

    @classmethod
    def check_model(cls, config: SACConfig, model: Any, observation_spaces: dict, action_space: Any) -> None:
        """SAC trains a squashed Gaussian with a per-state log-std on a Box, critics of vector groups, raw inputs."""
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"algo.name: sac needs a continuous (Box) action space, the env's is {action_space}")
        if model.action_transform != "squash":
            raise ValueError(
                "algo.name: sac needs model.action_transform: squash (its critics read the squashed action and its "
                "entropy needs tanh's log-determinant; the chunk stores actions before the transform)"
            )
        if model.log_std != "state":
            raise ValueError("algo.name: sac needs model.log_std: state (its actor's std depends on the state)")
        if model.obs_norm:
            raise ValueError(
                "algo.name: sac does not take model.obs_norm: its buffer holds raw observations while the statistics "
                "would change after every update; set model.obs_norm: false"
            )
        if model.critic:
            raise ValueError("algo.name: sac owns its Q critics (algo.critics): set model.critic: false")
        q_groups = critic_groups(observation_spaces, model.critic_inputs, model.actor_inputs)
        images = [g for g in q_groups if is_image_space(observation_spaces[g])]
        if images:
            raise ValueError(
                f"algo.name: sac's critics read vector groups only; model.critic_inputs {q_groups} has the image "
                f"group(s) {images} (the actor may read images: give the critics a vector group such as 'critic')"
            )

    def __init__(self, config: SACConfig, model: ActorCritic, ranks: Collectives):
        super().__init__(config, model, ranks)
        spaces, settings = model.observation_spaces, model.config
        self.check_model(config, settings, spaces, model.action_space)
        self.groups = list(settings.actor_inputs)
        self.q_groups = critic_groups(spaces, settings.critic_inputs, settings.actor_inputs)
        self.replay: ReplayBuffer | None = None  # the learner's (``use_replay``)
        self.demos: Dataset | None = None  # RLPD's (``attach``), drawn in passes
        width = model.actor.sampling.width
        q_in = sum(math.prod(spaces[g].shape or (1,)) for g in self.q_groups) + width
        self.qf = QEnsemble(config.critics, q_in, settings.hidden_sizes, settings.activation, config.layer_norm)
        self.qf.to(ranks.device)
        self.qf_target = copy.deepcopy(self.qf).requires_grad_(False)
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=config.q_lr, fused=True)
        self.q_step = GuardedStep(self.q_optimizer, config.max_grad_norm, config.max_nonfinite_updates, ranks)
        self.target_entropy = -float(width) if config.target_entropy is None else float(config.target_entropy)
        alpha = config.alpha if config.alpha is not None else (1.0 if config.autotune else 0.2)
        self.log_alpha = torch.tensor([math.log(max(alpha, 1e-8))], device=ranks.device, requires_grad=True)
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=config.q_lr, fused=True)
        self.a_step = GuardedStep(self.a_optimizer, math.inf, config.max_nonfinite_updates, ranks)
        self.carry = 0.0  # gradient steps owed but not taken (the fraction of updates_per_step x new steps)
        self.gradient_steps = 0  # taken over the run
        self.new: Transitions | None = None  # this update's transitions, for the coordinator to save

    # -- what the shards collect ------------------------------------------------------------------------------

    @classmethod
    def collection(cls, config: SACConfig) -> FixedSteps:
        return FixedSteps(config.num_steps)

    @classmethod
    def collection_at(cls, config: SACConfig, env_steps: int) -> FixedSteps:
        """Uniform random actions until ``learning_starts`` env steps were collected."""
        return FixedSteps(config.num_steps, random_actions=env_steps < config.learning_starts)

    # -- the data it learns from ------------------------------------------------------------------------------

    def use_replay(self, replay: ReplayBuffer) -> None:
        """The learner's replay buffer (``replay.capacity``), which ``update`` fills and samples."""
        self.replay = replay

    @classmethod
    def dataset(cls, config: SACConfig) -> tuple[str, str] | None:
        """RLPD's demonstrations (``algo.demonstrations``), if any."""
        return ("algo.demonstrations", config.demonstrations) if config.demonstrations else None

    def attach(self, demonstrations: Any) -> None:
        """RLPD: this rank's share of the demonstrations (``raysim.demos.Demonstrations`` with its transitions)."""
        share = demonstrations.split(self.ranks.rank, self.ranks.world_size)
        self.demos = Dataset(share.transitions(self.groups_read()))

    def groups_read(self) -> list[str]:
        """The observation groups the actor or the critics read: what a transition keeps."""
        return list(dict.fromkeys([*self.groups, *self.q_groups]))

    def appended(self) -> Transitions | None:
        """The transitions the last update appended (saved by the coordinator beside the checkpoints)."""
        return self.new

    def restore(self, segments: list[tuple[int, Transitions]]) -> None:
        """Refill the buffer from saved segments (``ReplayBuffer.restore``)."""
        self.replay.restore(segments)

    # -- the losses ---------------------------------------------------------------------------------------------

    def q_input(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> torch.Tensor:
        """The critics' input: their groups' vectors and the squashed action."""
        return torch.cat([obs[g].flatten(1).float() for g in self.q_groups] + [action], 1)

    def qf_loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Every critic's squared error to the soft Bellman target (min over a random subset of target critics)."""
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_log_prob = squashed_sample(self.model, batch["next_obs"], generator)
            target_q = self.qf_target(self.q_input(batch["next_obs"], next_action))
            if self.config.critic_subset < self.config.critics:
                subset = torch.randperm(self.config.critics, generator=generator)[: self.config.critic_subset]
                target_q = target_q[subset.to(target_q.device)]
            min_qf_next_target = target_q.min(0).values
            if self.config.backup_entropy:
                min_qf_next_target = min_qf_next_target - alpha * next_log_prob
            not_done = 1.0 - batch["terminated"].float()
            next_q_value = batch["reward"] + not_done * self.config.gamma * min_qf_next_target
        qf_values = self.qf(self.q_input(batch["obs"], torch.tanh(batch["actions"])))
        qf_loss = (qf_values - next_q_value).square().mean(1).sum()  # CleanRL: qf1_loss + qf2_loss
        return qf_loss, {"qf_loss": qf_loss, "qf_mean": qf_values.mean().detach()}

    def actor_loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``alpha * log pi(a|s) - Q(s, a)`` at the actor's own reparameterised actions; and their log-probabilities."""
        action, log_prob = squashed_sample(self.model, batch["obs"], generator)
        self.qf.requires_grad_(False)  # the gradient reaches the actor through the critics, not their weights
        try:
            qf_pi = self.qf(self.q_input(batch["obs"], action))
        finally:
            self.qf.requires_grad_(True)
        qf_pi = qf_pi.min(0).values if self.config.actor_q == "min" else qf_pi.mean(0)
        actor_loss = (self.log_alpha.exp().detach() * log_prob - qf_pi).mean()
        demos = self.demo_share()
        if self.config.bc_coef > 0 and demos:  # the batch's last rows are the demonstrations' (``sample``)
            demonstrated = {g: v[-demos:] for g, v in batch["obs"].items()}
            mean = self.model.actor.mean_of(self.model.actor(demonstrated))
            pull = (torch.tanh(mean) - torch.tanh(batch["actions"][-demos:])).square().sum(-1).mean()
            actor_loss = actor_loss + self.config.bc_coef * pull
        return actor_loss, log_prob.detach()

    # -- the update ---------------------------------------------------------------------------------------------

    def update(
        self, chunks: list[RolloutChunk], step: GuardedStep, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Append the chunks' transitions; then ``updates_per_step`` gradient steps per new env step past
        ``learning_starts`` (counted over every rank), each on a sampled batch."""
        parts = [chunk_transitions(c, self.groups_read()) for c in chunks]
        self.new = concat_transitions(parts) if parts else None
        if self.new is not None:
            self.replay.add(self.new)
        collected = self.ranks_sum(sum(c.env_steps for c in chunks))
        counted = max(0, self.env_steps + collected - max(self.env_steps, self.config.learning_starts))
        self.carry += self.config.updates_per_step * counted
        steps = int(self.carry)
        self.carry -= steps
        totals: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        started = time.perf_counter()
        for _ in range(steps):
            for name, value in self.gradient_step(step, generator).items():
                totals[name] = totals.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1
        seconds = time.perf_counter() - started
        metrics = {name: value / counts[name] for name, value in totals.items()}
        device = self.ranks.device
        metrics.update(
            replay_ratio=torch.tensor(steps / max(collected, 1), device=device),
            updates_per_s=torch.tensor(steps / max(seconds, 1e-9), device=device),
            buffer_size=torch.tensor(float(self.replay.size), device=device),
        )
        if self.demos is not None:
            metrics["demo_fraction"] = torch.tensor(self.demo_share() / self.rank_batch(), device=device)
        return metrics

    def gradient_step(self, step: GuardedStep, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """One gradient step of the critics; every ``policy_frequency`` of them, that many of the actor and alpha;
        then the target critics move toward the critics."""
        batch = self.sample(generator)
        samples = size_of(batch)
        qf_loss, metrics = self.qf_loss(batch, generator)
        self.q_step(qf_loss, {"qf_loss": qf_loss}, samples)
        self.gradient_steps += 1
        warming_up = self.env_steps < self.config.actor_warmup_steps
        if self.gradient_steps % self.config.policy_frequency == 0 and not warming_up:
            for _ in range(self.config.policy_frequency):
                actor_loss, log_prob = self.actor_loss(batch, generator)
                step(actor_loss, {"actor_loss": actor_loss}, samples)
                if self.config.autotune:
                    alpha_loss = (self.log_alpha.exp() * (-log_prob - self.target_entropy)).mean()
                    self.a_step(alpha_loss, {"alpha_loss": alpha_loss}, samples)
            metrics.update(actor_loss=actor_loss.detach(), entropy=-log_prob.mean())
        with torch.no_grad():  # Polyak averaging: theta' <- tau theta + (1 - tau) theta'
            torch._foreach_lerp_(list(self.qf_target.parameters()), list(self.qf.parameters()), self.config.tau)
        metrics["alpha"] = self.log_alpha.exp().detach().squeeze(0)
        return metrics

    def sample(self, generator: torch.Generator) -> Batch:
        """This rank's share of a batch: ``demo_fraction`` of it from the demonstrations (RLPD), the rest from the
        buffer; the observations, actions and flags on the learner's device."""
        share, demos = self.rank_batch(), self.demo_share()
        parts = [self.replay.sample(share - demos, generator)]
        if demos:
            parts.append(self.demos.sample(demos, generator))
        batch = concat_transitions(parts)
        device = self.ranks.device
        if device.type == "cpu":
            return batch
        return {
            k: ({g: t.to(device) for g, t in v.items()} if isinstance(v, dict) else v.to(device))
            for k, v in batch.items()
        }

    def rank_batch(self) -> int:
        """This rank's share of ``batch_size`` (the ranks' gradients are averaged, weighted by their samples)."""
        return math.ceil(self.config.batch_size / self.ranks.world_size)

    def demo_share(self) -> int:
        """How many of this rank's batch come from the demonstrations (RLPD)."""
        return round(self.rank_batch() * self.config.demo_fraction) if self.demos is not None else 0

    def ranks_sum(self, count: int) -> int:
        """``count`` summed over the learner ranks (every rank takes the same number of gradient steps)."""
        if self.ranks.world_size == 1:
            return count
        total = torch.tensor([float(count)], device=self.ranks.device)
        self.ranks.all_reduce(total)
        return int(total.item())

    # -- state ---------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "sac": {
                "qf": self.qf.state_dict(),
                "qf_target": self.qf_target.state_dict(),
                "q_optimizer": self.q_optimizer.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(),
                "a_optimizer": self.a_optimizer.state_dict(),
                "carry": self.carry,
                "gradient_steps": self.gradient_steps,
                "skipped": [self.q_step.skipped, self.q_step.consecutive, self.a_step.skipped, self.a_step.consecutive],
                **({"demos": self.demos.state_dict()} if self.demos is not None else {}),
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("sac")
        if saved is None:
            return
        self.qf.load_state_dict(saved["qf"])
        self.qf_target.load_state_dict(saved["qf_target"])
        self.q_optimizer.load_state_dict(saved["q_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(saved["log_alpha"]))
        self.a_optimizer.load_state_dict(saved["a_optimizer"])
        self.carry, self.gradient_steps = float(saved["carry"]), int(saved["gradient_steps"])
        if self.demos is not None and "demos" in saved:
            self.demos.load_state_dict(saved["demos"])
        self.q_step.skipped, self.q_step.consecutive, self.a_step.skipped, self.a_step.consecutive = (
            int(n) for n in saved["skipped"]
        )
