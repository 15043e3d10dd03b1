"""``Learner``: the model, the optimizer, value inference, advantages and the update.

The coordinator's loop calls it once per iteration (in-process or as a Ray actor, same class)::

    weights = learner.get_weights()            # remote: an object ref, handed to the shards
    chunks = [shard.rollout(weights, T) for shard in shards]
    metrics = learner.update(*chunks)          # remote: the shards' chunk refs, resolved by Ray

Chunks reach the learner as object refs resolved by Ray, never through the driver; the weights
leave it as one object ref that every shard reads.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import torch

from raysim.algos.guard import GuardedStep
from raysim.algos.grpo import GRPOConfig, chunk_advantages, grpo_update
from raysim.algos.models import ActorCritic, ModelConfig
from raysim.algos.ppo import PPOConfig, ppo_update
from raysim.rollout.advantages import chunk_values, gae
from raysim.rollout.chunk import RolloutChunk
from raysim.seeding import derive_seed


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU Ray assigned to this process when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"learner.device is {device!r} but no GPU is visible here (learner.num_gpus > 0?)")
    return torch.device(device)


class Learner:
    """Trains an ``ActorCritic`` with PPO or GRPO on rollout chunks; publishes versioned actor weights.

    Dispatches on ``algo.name``: ``ppo`` (values, GAE, actor and critic losses) or ``grpo``
    (group-relative episode returns, no critic and no value inference at all; with ``kl_coef > 0``
    a frozen copy of the initial actor is kept as the KL reference).
    """

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        action_space: gym.Space,
        model: ModelConfig,
        algo: PPOConfig | GRPOConfig,
        iterations: int,
        seed: int = 0,
        device: str = "cpu",
    ):
        torch.manual_seed(derive_seed(seed, 3))
        self.algo = algo
        self.device = resolve_device(device)
        if algo.name not in ("ppo", "grpo"):
            raise ValueError(f"algo.name must be 'ppo' or 'grpo', got {algo.name!r}")
        self.needs_values = getattr(algo, "needs_values", True)
        self.model = ActorCritic(observation_spaces, action_space, model).to(self.device)
        if self.needs_values and self.model.critic is None:
            raise ValueError(f"algo {algo.name!r} needs a critic, but model.critic is false")
        self.reference = None  # GRPO's KL reference: the initial actor, frozen
        if algo.name == "grpo" and algo.kl_coef > 0:
            self.reference = copy.deepcopy(self.model.actor).requires_grad_(False).eval()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=algo.lr, eps=1e-5)
        if algo.lr_schedule not in ("constant", "linear"):
            raise ValueError(f"algo.lr_schedule must be 'constant' or 'linear', got {algo.lr_schedule!r}")
        linear = algo.lr_schedule == "linear"
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: max(0.0, 1.0 - i / max(1, iterations)) if linear else 1.0
        )
        self.step = GuardedStep(self.optimizer, algo.max_grad_norm, algo.max_nonfinite_updates)
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 4))
        self.version = 0

    def get_weights(self) -> dict[str, Any]:
        """The actor's weights for the shards: ``{"version": v, "actor": state_dict on CPU}``."""
        actor = {k: v.detach().to("cpu", copy=True) for k, v in self.model.actor.state_dict().items()}
        return {"version": self.version, "actor": actor}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training: model, optimizer, schedule, RNG, version."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "version": self.version,
            **({"reference": self.reference.state_dict()} if self.reference is not None else {}),
        }

    def update(self, *chunks: RolloutChunk) -> dict[str, float]:
        """One PPO or GRPO update on the chunks; returns the iteration's metrics as plain numbers."""
        batch = self.batch(chunks)
        if self.algo.name == "grpo":
            metrics = grpo_update(self.model.actor, self.step, batch, self.algo, self.generator, self.reference)
        else:
            metrics = ppo_update(self.model, self.step, batch, self.algo, self.generator)
        metrics["lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        self.version += 1
        names = list(metrics)
        values = torch.stack([metrics[n].float().to("cpu") for n in names]).tolist() if names else []
        result = dict(zip(names, values))
        result.update(episode_stats(chunks))
        result["env_steps"] = sum(c.env_steps for c in chunks)
        result["skipped_updates"] = self.step.skipped
        result["policy_version"] = self.version
        return result

    def batch(self, chunks: tuple[RolloutChunk, ...]) -> dict:
        """Advantages (PPO: also values and returns) of every valid transition, flattened into one batch."""
        parts = []
        for chunk in chunks:
            chunk = to_device(chunk, self.device)
            valid = chunk.mask
            if not self.needs_values:  # GRPO: group-relative returns, no critic anywhere
                advantages = chunk_advantages(chunk, self.algo)
                parts.append(
                    {
                        "obs": {k: v[:-1][valid] for k, v in chunk.obs.items()},
                        "actions": chunk.actions[valid],
                        "logprobs": chunk.logp[valid],
                        "advantages": advantages[valid],
                    }
                )
                continue
            values, next_values = chunk_values(self.model.critic, chunk)
            done = chunk.terminated | chunk.truncated
            advantages = gae(chunk.reward, values, next_values, done, chunk.mask, self.algo.gamma, self.algo.gae_lambda)
            parts.append(
                {
                    "obs": {k: v[:-1][valid] for k, v in chunk.obs.items()},
                    "actions": chunk.actions[valid],
                    "logprobs": chunk.logp[valid],
                    "advantages": advantages[valid],
                    "returns": (advantages + values)[valid],
                    "values": values[valid],
                }
            )
        return concat(parts)


def to_device(chunk: RolloutChunk, device: torch.device) -> RolloutChunk:
    """The chunk's tensors on ``device`` (the same object when already there)."""
    if device.type == "cpu":
        return chunk
    fields = {
        k: ({g: t.to(device) for g, t in v.items()} if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v)
        for k, v in vars(chunk).items()
    }
    return RolloutChunk(**fields)


def concat(parts: list[dict]) -> dict:
    """Concatenate a list of (nested) batches along the first dimension."""
    return {
        k: concat([p[k] for p in parts]) if isinstance(parts[0][k], dict) else torch.cat([p[k] for p in parts])
        for k in parts[0]
    }


def episode_stats(chunks: tuple[RolloutChunk, ...]) -> dict[str, float]:
    """Mean return, length (and success rate) of the episodes completed in these chunks."""
    columns = {
        k: torch.cat([c.episodes[k] for c in chunks if k in c.episodes] or [torch.zeros(0)])
        for k in ("return", "length", "success")
    }
    count = columns["return"].numel()
    stats = {"episodes": float(count)}
    if count:
        stats["episode_return"] = float(columns["return"].float().mean())
        stats["episode_length"] = float(columns["length"].float().mean())
        if columns["success"].numel() == count:
            stats["success_rate"] = float(columns["success"].float().mean())
    return stats
