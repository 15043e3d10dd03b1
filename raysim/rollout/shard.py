"""``EnvShard``: N rows of one batched env and a CPU copy of the policy's actor.

The coordinator's loop calls it once per iteration (in-process or as a Ray actor, same class)::

    weights = learner.get_weights()                      # {"version": v, "actor": state_dict}
    chunk = shard.rollout(weights, num_steps)            # remote: shard.rollout.remote(ref, T)
    learner.update([chunk, ...])

The shard acts actor-side for ``num_steps`` steps in inference mode and returns one
``RolloutChunk`` of owned tensors. Episodes continue across chunks: the next chunk starts from
``chunk.obs[T]`` with the rows' running episodes.
"""

from __future__ import annotations

from typing import Any

import torch

from raysim.algos.models import Actor, ModelConfig
from raysim.envs import make
from raysim.envs.contract import Obs, Step
from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.episodes import run_episodes
from raysim.rollout.groups import rollout_groups
from raysim.rollout.inference import inference
from raysim.seeding import derive_seed

ON_NONFINITE = ("raise", "mask")


class NonFiniteError(RuntimeError):
    """An env returned NaN or inf in an observation or a reward."""


class EnvShard:
    """One batched env of ``num_envs`` rows plus the acting policy; produces rollout chunks.

    ``on_nonfinite``: ``raise`` (default) stops with the env id, row and step of a non-finite
    observation or reward; ``mask`` drops that row's transition from the chunk (``mask`` False),
    restarts the row's episode and counts it in ``chunk.nonfinite``.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        model: ModelConfig | dict | None = None,
        env_kwargs: dict[str, Any] | None = None,
        shard_index: int = 0,
        on_nonfinite: str = "raise",
    ):
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
        torch.set_num_threads(1)
        self.env_id = env_id
        self.shard_index = shard_index
        self.on_nonfinite = on_nonfinite
        self.seed = seed
        self.env = make(env_id, num_envs, seed=seed, **dict(env_kwargs or {}))
        model = model if isinstance(model, ModelConfig) else ModelConfig(**(model or {}))
        self.actor = Actor(self.env.observation_spaces, self.env.action_space, model)
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 1))
        self.obs = self.env.reset(seed)
        self.version = -1
        self.steps_done = 0  # env steps taken by this shard, across chunks
        self._resets = 0
        self._group_rounds = 0  # rounds of rollout_groups played (part of the group reset seeds)

    def spaces(self) -> tuple[dict, Any, int | None]:
        """The env's observation spaces (per group), action space and episode step limit."""
        return self.env.observation_spaces, self.env.action_space, self.env.max_episode_steps

    def evaluate(
        self,
        weights: dict,
        quotas: list[int],
        row_offset: int,
        seed: int,
        max_steps: int,
        deterministic: bool = True,
        stop_after: int | None = None,
    ) -> list[tuple[dict, dict]]:
        """Play seeded evaluation episodes on this shard's rows with per-row quotas (``run_episodes``)."""
        self.set_weights(weights)
        generator = torch.Generator()
        generator.manual_seed(derive_seed(seed, 5, row_offset))
        return run_episodes(self.env, self.actor, quotas, row_offset, seed, max_steps, deterministic, generator, stop_after)

    def get_state(self) -> dict[str, Any]:
        """The shard's state for a checkpoint: env state (None if the env cannot save it), RNG, counters."""
        return {
            "env": self.env.get_state(),
            "obs": {k: v.clone() for k, v in self.obs.items()},
            "generator": self.generator.get_state(),
            "steps_done": self.steps_done,
            "resets": self._resets,
            "group_rounds": self._group_rounds,
        }

    def set_state(self, state: dict[str, Any]) -> str:
        """Continue from a ``get_state`` result; returns how (exactly, or with fresh episodes)."""
        self.generator.set_state(state["generator"])
        self.steps_done, self._resets, self._group_rounds = state["steps_done"], state["resets"], state["group_rounds"]
        if state["env"] is None or self.env.get_state() is None:
            self.obs = self.env.reset(derive_seed(self.seed, 6, self.steps_done))
            return "fresh episodes (this env cannot save its state)"
        self.env.set_state(state["env"])
        self.obs = {k: v.clone() for k, v in state["obs"].items()}
        return "exact"

    def set_weights(self, weights: dict) -> None:
        """Load the actor weights ``{"version": v, "actor": state_dict}`` unless already loaded."""
        if weights["version"] != self.version:
            self.actor.load_state_dict(weights["actor"])
            self.version = weights["version"]

    def rollout(self, weights: dict, num_steps: int) -> RolloutChunk:
        """Act ``num_steps`` steps with ``weights`` and return the chunk."""
        self.set_weights(weights)
        T, N = int(num_steps), self.env.num_envs
        obs = {k: torch.empty((T + 1, *v.shape), dtype=v.dtype) for k, v in self.obs.items()}
        actions: torch.Tensor | None = None
        logp = torch.empty(T, N)
        reward = torch.empty(T, N)
        terminated = torch.empty(T, N, dtype=torch.bool)
        truncated = torch.empty(T, N, dtype=torch.bool)
        mask = torch.ones(T, N, dtype=torch.bool)
        finals: list[tuple[int, Step]] = []
        nonfinite = 0
        with inference(self.actor):
            for t in range(T):
                for k, v in self.obs.items():
                    obs[k][t] = v
                action, logp[t] = self.actor.sample(self.obs["policy"], self.generator)
                if actions is None:
                    actions = torch.empty((T, *action.shape), dtype=action.dtype)
                actions[t] = action
                step = self.env.step(self.actor.env_action(action))
                if step.valid is not None:
                    mask[t] = step.valid
                nonfinite += self._check_finite(step, t, mask[t])
                reward[t] = step.reward
                terminated[t] = step.terminated
                truncated[t] = step.truncated
                if step.done_rows.numel():
                    finals.append((t, step))
                self.obs = step.obs
                self.steps_done += 1
        for k, v in self.obs.items():
            obs[k][T] = v
        return self._chunk(obs, actions, logp, reward, terminated, truncated, mask, finals, nonfinite)

    def rollout_groups(self, weights: dict, max_steps: int, group_size: int) -> RolloutChunk:
        """GRPO: one episode per row, groups of ``group_size`` rows from a shared start (``raysim.rollout.groups``)."""
        return rollout_groups(self, weights, max_steps, group_size)

    def _check_finite(self, step: Step, t: int, mask_t: torch.Tensor) -> int:
        """Raise on (or mask and restart) rows with a non-finite reward or observation."""
        groups = [step.obs, step.final_obs]
        if bool(torch.isfinite(step.reward).all()) and all(
            bool(torch.isfinite(v).all()) for g in groups for v in g.values()
        ):
            return 0
        bad = ~torch.isfinite(step.reward)
        for name, value in step.obs.items():
            bad |= ~torch.isfinite(value.flatten(1)).all(1)
        for name, value in step.final_obs.items():
            bad[step.done_rows] |= ~torch.isfinite(value.flatten(1)).all(1)
        rows = bad.nonzero().squeeze(1)
        if self.on_nonfinite == "raise":
            raise NonFiniteError(
                f"{self.env_id} returned a non-finite observation or reward in row {int(rows[0])} of shard "
                f"{self.shard_index} at step {self.steps_done} (step {t} of this chunk); rows affected: "
                f"{rows.tolist()}. Fix the env, or set on_nonfinite: mask to drop such rows and count them."
            )
        mask_t[rows] = False
        # The rows' episodes are discarded, not finished: no flags, final_obs or report for them
        # (a NaN reward on a row's last step would otherwise put a NaN return in the chunk).
        step.reward = step.reward.masked_fill(bad, 0.0)
        step.terminated = step.terminated & ~bad
        step.truncated = step.truncated & ~bad
        keep = ~bad[step.done_rows]
        step.done_rows = step.done_rows[keep]
        if step.done_rows.numel():
            step.final_obs = {k: v[keep] for k, v in step.final_obs.items()}
            step.episodes = {k: v[keep] for k, v in step.episodes.items()}
        else:
            step.final_obs, step.episodes = {}, {}
        seeds = [derive_seed(self.seed, 2, self._resets, int(r)) for r in rows]
        self._resets += 1
        step.obs = self.env.reset_rows(rows, seeds)
        return int(rows.numel())

    def _chunk(self, obs, actions, logp, reward, terminated, truncated, mask, finals, nonfinite) -> RolloutChunk:
        """Gather the compact final_obs and the episode records of the finished rows."""
        final_obs = {k: torch.cat([s.final_obs[k] for _, s in finals]) for k in obs} if finals else {
            k: v.new_empty((0, *v.shape[2:])) for k, v in obs.items()
        }
        final_t = torch.cat([torch.full_like(s.done_rows, t) for t, s in finals]) if finals else torch.empty(0, dtype=torch.int64)
        final_row = torch.cat([s.done_rows for _, s in finals]) if finals else torch.empty(0, dtype=torch.int64)
        keys = set.intersection(*(set(s.episodes) for _, s in finals)) if finals else set()
        episodes = {k: torch.cat([s.episodes[k] for _, s in finals]) for k in sorted(keys)} if finals else {
            "length": torch.empty(0, dtype=torch.int64),  # the columns every report has, also with E == 0
            "return": torch.empty(0),
        }
        episodes["row"], episodes["t"] = final_row.clone(), final_t.clone()
        return RolloutChunk(
            obs=obs,
            actions=actions,
            logp=logp,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            mask=mask,
            final_obs=final_obs,
            final_t=final_t,
            final_row=final_row,
            episodes=episodes,
            policy_version=self.version,
            shard=self.shard_index,
            nonfinite=nonfinite,
        )
