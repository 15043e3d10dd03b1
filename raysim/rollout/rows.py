"""``Rows``: a shard's rows of one batched env, and all that acting leaves of them between runs.

An ``EnvShard`` is its rows and how it acts (``raysim.rollout.acting``). The rows are the env (with its frame
stacks), the observations the next run starts from, each row's recurrent state (``model.recurrent``), the generator
every training draw takes from, the counters that key the rows' reset seeds, the non-finite checks, and the state a
checkpoint keeps of them::

    state = rows.get_state()               # an ArrayDict: env state, obs, generator, counters, recurrent state
    how = rows.set_state(state)            # "exact", or "fresh episodes (why)"
    rows.start_fresh(key)                  # new episodes everywhere, keyed by where the run continues
"""

from __future__ import annotations

from typing import Any

import torch

from raysim.envs import FrameStackConfig, make, stacked
from raysim.envs.contract import Step
from raysim.envs.messages import captured
from raysim.models import RowMemory
from raysim.rollout.arrays import ArrayDict
from raysim.rollout.chunk import RolloutChunk
from raysim.seeding import SERVER_LOST, derive_seed

ON_NONFINITE = ("raise", "mask")


class NonFiniteError(RuntimeError):
    """An env returned NaN or inf in an observation or a reward."""


class Rows:
    """``num_envs`` rows of env ``env_id`` (``raysim.envs.make``, stacked by ``frame_stack``) and their bookkeeping.

    ``memory`` (a recurrent actor's state per row, zeroed where a row's episode starts) is the acting kind's to make
    (``EnvShard``); None for a feed-forward actor. ``on_nonfinite``: ``raise`` stops with the env id, row and step of
    a non-finite observation or reward; ``mask`` drops that row's transition and restarts its episode.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        env_kwargs: dict[str, Any] | None,
        shard_index: int,
        on_nonfinite: str,
        frame_stack: FrameStackConfig | dict | None,
        evaluation: bool,
        success: str | None,
    ):
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
        self.env_id, self.shard_index, self.on_nonfinite, self.seed = env_id, shard_index, on_nonfinite, seed
        with captured() as self.messages:  # said once by the driver, not once per shard (envs.messages)
            env = make(env_id, num_envs, seed=seed, evaluation=evaluation, success=success, **dict(env_kwargs or {}))
            self.env = stacked(env, frame_stack)
        self.memory: RowMemory | None = None
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 1))
        self.obs = self.env.reset(seed)
        self.steps_done = 0  # training env steps taken by these rows, across chunks
        self.resets = 0  # restarts of rows after a non-finite value (part of their reset seeds)
        self.group_rounds = 0  # GRPO rounds played (part of the group reset seeds)
        self.fresh = True  # the rows start fresh episodes: the next chunk says so (``RolloutChunk.fresh``)
        self.server_losses = 0  # times the policy server died while they collected (a key of their fresh episodes)

    # -- episodes -------------------------------------------------------------------------------

    def take_fresh(self) -> bool:
        """Whether this chunk starts fresh episodes (only the first after the rows were created or started them
        anew: ``start_fresh``, or ``set_state`` without the saved episodes)."""
        fresh, self.fresh = self.fresh, False
        return fresh

    def restart_rows(self, step: Step, rows: torch.Tensor) -> int:
        """Start new training episodes in ``rows`` (a bool mask) after a non-finite value; returns their count."""
        index = rows.nonzero().squeeze(1)
        seeds = [derive_seed(self.seed, 2, self.resets, int(r)) for r in index]
        self.resets += 1
        step.obs = self.env.reset_rows(index, seeds)
        if self.memory is not None:
            self.memory.restart(index)
        return int(index.numel())

    def start_fresh(self, key: int) -> None:
        """Start new episodes in every row, as a replacement shard does: the rows reset and the sampling
        generator reseeded from ``key`` (where the run continues), none an episode this shard's seed began."""
        self.generator.manual_seed(derive_seed(self.seed, 1, key))
        self._reset_all(key)

    def abandon(self, steps: int, rounds: int) -> None:
        """Drop the collection that began with ``steps`` taken and ``rounds`` played (its policy server died): the
        counters go back, the rows start fresh episodes."""
        self.steps_done, self.group_rounds = steps, rounds
        self.server_losses += 1
        self.start_fresh(derive_seed(SERVER_LOST, self.server_losses, steps))

    def _reset_all(self, key: int) -> None:
        """Every row resets from a seed keyed by ``key``; the next chunk starts fresh episodes."""
        self.obs = self.env.reset(derive_seed(self.seed, 6, key))
        self.fresh = True
        if self.memory is not None:
            self.memory.restart(torch.arange(self.env.num_envs))

    # -- checkpoints ----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The rows' state for a checkpoint: env state (None if the env cannot save it), RNG, counters; an
        ``ArrayDict``, so its tensors (image observations too) cross the object store as NumPy arrays."""
        state = {
            "env": self.env.get_state(),
            "obs": {k: v.clone() for k, v in self.obs.items()},
            "generator": self.generator.get_state(),
            "steps_done": self.steps_done,
            "resets": self.resets,
            "group_rounds": self.group_rounds,
        }
        if self.memory is not None:
            state["memory"] = self.memory.get_state()
        return ArrayDict(state)

    def set_state(self, state: dict[str, Any]) -> str:
        """Continue from a ``get_state`` result; returns how (exactly, or with fresh episodes). What it keeps it
        copies (the env's ``set_state`` too): the tensors may be read-only views of the object store. A pipelined
        worker's state (``servers.pipeline``: its groups' envs, not one of all the rows): fresh episodes."""
        groups = state.get("groups")
        if groups is not None:
            self.steps_done, self.resets = (sum(int(group[k]) for group in groups) for k in ("steps_done", "resets"))
            self.start_fresh(self.steps_done)
            return f"fresh episodes (the saved state is that of {len(groups)} groups: servers.pipeline)"
        self.generator.set_state(state["generator"])
        self.steps_done, self.resets, self.group_rounds = state["steps_done"], state["resets"], state["group_rounds"]
        fresh = self._why_fresh(state)
        if fresh is not None:
            self._reset_all(self.steps_done)
            return f"fresh episodes ({fresh})"
        self.env.set_state(state["env"])
        self.obs = {k: v.clone() for k, v in state["obs"].items()}
        if self.memory is not None:
            self.memory.set_state(state["memory"])
        self.fresh = False
        return "exact"

    def _why_fresh(self, state: dict[str, Any]) -> str | None:
        """Why the saved episodes cannot continue in these rows; None where they can."""
        rows = next(iter(state["obs"].values())).shape[0]
        if rows != self.env.num_envs:
            return f"{rows} rows saved per shard, {self.env.num_envs} now"
        if {g: v.shape[1:] for g, v in state["obs"].items()} != {g: v.shape[1:] for g, v in self.obs.items()}:
            return "the saved observations have other shapes: another env.frame_stack?"
        if self.memory is not None and "memory" not in state:
            return "the saved shard state has no recurrent state: model.recurrent was none"
        if state["env"] is None or self.env.get_state() is None:
            return "this env cannot save its state"
        return None

    # -- non-finite values ----------------------------------------------------------------------

    def nonfinite_rows(self, step: Step, t: int) -> torch.Tensor | None:
        """Rows with a non-finite reward or observation in ``step``: raise, or discard them (``mask``).

        A discarded row's transition is marked invalid and its episode is dropped, not finished: no
        flags, final_obs or report for it (a NaN reward on a row's last step would otherwise put a
        NaN return in the chunk). The ending restarts the row.
        """
        if all_finite(step.reward) and all(
            all_finite(v) for group in (step.obs, step.final_obs) for v in group.values()
        ):
            return None
        bad = ~torch.isfinite(step.reward)
        for value in step.obs.values():
            bad |= ~torch.isfinite(value.flatten(1)).all(1)
        for value in step.final_obs.values():
            bad[step.done_rows] |= ~torch.isfinite(value.flatten(1)).all(1)
        if self.on_nonfinite == "raise":
            raise NonFiniteError(self._nonfinite_message(bad.nonzero().squeeze(1), t))
        step.valid = ~bad if step.valid is None else step.valid & ~bad
        step.reward = step.reward.masked_fill(bad, 0.0)
        step.terminated = step.terminated & ~bad
        step.truncated = step.truncated & ~bad
        keep, kept_episodes = ~bad[step.done_rows], ~bad[step.ended_rows()]
        if step.episode_rows is not None:
            step.episode_rows = step.episode_rows[kept_episodes]
        step.done_rows = step.done_rows[keep]
        step.final_obs = {k: v[keep] for k, v in step.final_obs.items()} if step.done_rows.numel() else {}
        step.episodes = {k: v[kept_episodes] for k, v in step.episodes.items()} if kept_episodes.any() else {}
        return bad

    def raise_if_nonfinite(self, chunk: RolloutChunk, steps: int) -> None:
        """Raise ``NonFiniteError`` for the first of the chunk's first ``steps`` steps with a non-finite value.

        One check over the whole chunk (the common case: all finite); only when it fails are the
        step and rows located, as the per-step check would have reported them.
        """
        reward, obs, final_obs = chunk.reward[:steps], chunk.obs, chunk.final_obs
        if (
            all_finite(reward)
            and all(all_finite(v[1 : steps + 1]) for v in obs.values())
            and all(all_finite(v) for v in final_obs.values())
        ):
            return
        bad = ~torch.isfinite(reward)
        for value in obs.values():
            bad |= ~torch.isfinite(value[1 : steps + 1].flatten(2)).all(2)
        for value in final_obs.values():
            bad_final = ~torch.isfinite(value.flatten(1)).all(1) & (chunk.final_t < steps)
            bad[chunk.final_t[bad_final], chunk.final_row[bad_final]] = True
        t = int(bad.any(1).nonzero()[0, 0])
        self.steps_done -= steps - t
        raise NonFiniteError(self._nonfinite_message(bad[t].nonzero().squeeze(1), t))

    def _nonfinite_message(self, rows: torch.Tensor, t: int) -> str:
        return (
            f"{self.env_id} returned a non-finite observation or reward in row {int(rows[0])} of shard "
            f"{self.shard_index} at step {self.steps_done} (step {t} of this chunk); rows affected: "
            f"{rows.tolist()}. Fix the env, or set env.on_nonfinite: mask to drop such rows and count them."
        )


def all_finite(value: torch.Tensor) -> bool:
    """Whether every value is finite; integer tensors (uint8 images) always are and are not scanned (an Atari
    chunk's frames took ~5 ms a check)."""
    return not value.is_floating_point() or bool(torch.isfinite(value).all())
