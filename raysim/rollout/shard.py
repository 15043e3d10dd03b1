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

from raysim.algos.fast import MLPInference
from raysim.algos.models import Actor, ModelConfig, sample_categorical
from raysim.envs import make
from raysim.envs.contract import Step
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
        self._acting: tuple | None = None  # (MLPInference of the actor, probs and noise buffers), per row count

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

    def collect(self, method: str, weights: dict, *args: Any) -> tuple[RolloutChunk, dict[str, int]]:
        """``rollout`` or ``rollout_groups``, plus a small receipt.

        The coordinator reads only the receipt: it learns that the shard is alive and the chunk
        exists without pulling the chunk itself through the driver.
        """
        if method not in ("rollout", "rollout_groups"):
            raise ValueError(f"collect: unknown method {method!r}")
        chunk = getattr(self, method)(weights, *args)
        return chunk, {"shard": self.shard_index, "env_steps": chunk.env_steps}

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
        """Act ``num_steps`` steps with ``weights`` and return the chunk.

        The hot loop of collection; it computes exactly what a plain per-step loop does
        (``Actor.sample`` on ``obs["policy"]``, ``env.step``, copy into the chunk; see
        tests/test_fast_path.py) with less overhead per step:

        - the chunk's tensors are allocated once per chunk (they belong to the chunk) and every
          step writes into them in place;
        - a discrete actor acts through ``MLPInference`` (fused layers, preallocated buffers) and
          ``sample_categorical`` into the chunk's ``actions[t]`` and ``logp[t]``: no distribution
          objects, no temporaries;
        - with ``on_nonfinite: raise`` finiteness is checked once per chunk, not once per step
          (4 host syncs per step before); the first bad step and rows are then located for the
          same message. ``mask`` must restart rows at once, so it checks every step.
        """
        self.set_weights(weights)
        T, N = int(num_steps), self.env.num_envs
        obs = {k: torch.empty((T + 1, *v.shape), dtype=v.dtype) for k, v in self.obs.items()}
        logp = torch.empty(T, N)
        reward = torch.empty(T, N)
        terminated = torch.empty(T, N, dtype=torch.bool)
        truncated = torch.empty(T, N, dtype=torch.bool)
        mask = torch.ones(T, N, dtype=torch.bool)
        fast = self.actor.discrete
        actions = torch.empty(T, N, dtype=torch.int64) if fast else None
        finals: list[tuple[int, Step]] = []
        nonfinite, start = 0, self.steps_done
        check_each_step = self.on_nonfinite == "mask"
        # per-step views made once per chunk (one unbind each instead of an indexing call per step)
        obs_t = {k: v.unbind(0) for k, v in obs.items()}
        reward_t, terminated_t, truncated_t, logp_t = reward.unbind(0), terminated.unbind(0), truncated.unbind(0), logp.unbind(0)
        actions_t = actions.unbind(0) if fast else None
        t = 0
        try:
            with inference(self.actor):
                for t in range(T):
                    for k, v in self.obs.items():
                        obs_t[k][t].copy_(v)
                    if fast:
                        action = self._sample_discrete(self.obs["policy"], actions_t[t], logp_t[t])
                    else:
                        action, logp[t] = self.actor.sample(self.obs["policy"], self.generator)
                        if actions is None:
                            actions = torch.empty((T, *action.shape), dtype=action.dtype)
                        actions[t] = action
                    step = self.env.step(self.actor.env_action(action))
                    if step.valid is not None:
                        mask[t] = step.valid
                    if check_each_step:
                        self.steps_done = start + t
                        nonfinite += self._check_finite(step, t, mask[t])
                    reward_t[t].copy_(step.reward)
                    terminated_t[t].copy_(step.terminated)
                    truncated_t[t].copy_(step.truncated)
                    if step.done_rows.numel():
                        finals.append((t, step))
                    self.obs = step.obs
        except Exception as error:
            if not check_each_step:  # an env may fail on the non-finite values it produced: say so first
                try:
                    partial = self._chunk(obs, actions, logp, reward, terminated, truncated, mask, finals, nonfinite)
                except Exception:  # noqa: BLE001 - nothing to add to the env's own error
                    raise error from None
                self._raise_if_nonfinite(partial, start, t)
            raise
        self.steps_done = start + T
        for k, v in self.obs.items():
            obs[k][T].copy_(v)
        chunk = self._chunk(obs, actions, logp, reward, terminated, truncated, mask, finals, nonfinite)
        if not check_each_step:
            self._raise_if_nonfinite(chunk, start, T)
        return chunk

    def _sample_discrete(self, policy_obs: torch.Tensor, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` for a discrete actor, bitwise, written into ``action`` [N] and ``logp`` [N]."""
        acting = self._acting
        if acting is None or acting[0].net is not self.actor.net or acting[1].shape[0] != policy_obs.shape[0]:
            rows, width = policy_obs.shape[0], self.actor.net[-1].out_features
            acting = self._acting = (MLPInference(self.actor.net, self.actor.obs_norm), torch.empty(rows, width), torch.empty(rows, width))
        net, probs, noise = acting
        log_probs = net(policy_obs if policy_obs.dim() == 2 else policy_obs.flatten(1)).log_softmax(-1)
        torch.exp(log_probs, out=probs)
        sample_categorical(probs, self.generator, noise=noise, out=action)
        torch.gather(log_probs, 1, action.unsqueeze(1), out=logp.unsqueeze(1))
        return action

    def _raise_if_nonfinite(self, chunk: RolloutChunk, start: int, steps: int) -> None:
        """Raise ``NonFiniteError`` for the first of the chunk's first ``steps`` steps with a non-finite value.

        One check over the whole chunk (the common case: all finite); only when it fails are the
        step and rows located, as the per-step check would have reported them.
        """
        reward, obs, final_obs = chunk.reward[:steps], chunk.obs, chunk.final_obs
        if bool(torch.isfinite(reward).all()) and all(bool(torch.isfinite(v[1 : steps + 1]).all()) for v in obs.values()) \
                and all(bool(torch.isfinite(v).all()) for v in final_obs.values()):
            return
        bad = ~torch.isfinite(reward)
        for value in obs.values():
            bad |= ~torch.isfinite(value[1 : steps + 1].flatten(2)).all(2)
        for value in final_obs.values():
            bad_final = ~torch.isfinite(value.flatten(1)).all(1) & (chunk.final_t < steps)
            bad[chunk.final_t[bad_final], chunk.final_row[bad_final]] = True
        t = int(bad.any(1).nonzero()[0, 0])
        self.steps_done = start + t
        rows = bad[t].nonzero().squeeze(1)
        raise NonFiniteError(self._nonfinite_message(rows, t))

    def _nonfinite_message(self, rows: torch.Tensor, t: int) -> str:
        return (
            f"{self.env_id} returned a non-finite observation or reward in row {int(rows[0])} of shard "
            f"{self.shard_index} at step {self.steps_done} (step {t} of this chunk); rows affected: "
            f"{rows.tolist()}. Fix the env, or set on_nonfinite: mask to drop such rows and count them."
        )

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
            raise NonFiniteError(self._nonfinite_message(rows, t))
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
