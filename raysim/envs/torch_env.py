"""``TorchEnv``: the step contract implemented once for native batched torch tasks.

A task subclasses it and writes only its physics: how to sample initial states, how to advance
one step, what to observe, and which scalars its episode report adds. Episode bookkeeping, the
step limit, owned ``final_obs`` and the same-step auto-reset live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.envs.contract import BatchedEnv, Obs, Step, check_actions, check_num_envs, take_rows


class TorchEnv(BatchedEnv):
    """A batched env whose rows live in torch tensors on one device.

    ``state_keys`` names the task's tensor attributes that, with the episode bookkeeping and the
    generator, make up the env's whole state (``get_state`` / ``set_state``, for checkpoints).
    """

    state_keys: tuple[str, ...] = ()

    def __init__(self, num_envs: int, seed: int | None, max_episode_steps: int, device: str = "cpu"):
        self.num_envs = check_num_envs(num_envs)
        if not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an integer >= 1, got {max_episode_steps!r}")
        self.max_episode_steps = max_episode_steps
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(0 if seed is None else int(seed))
        self.episode_return = torch.zeros(self.num_envs, device=self.device)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._all_rows = torch.arange(self.num_envs, device=self.device)

    # -- task resources -------------------------------------------------------------------------

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Turn resource declarations in ``options`` (its own copy) into arrays; default: none."""
        return options

    @classmethod
    def export_resources(cls, options: dict[str, Any], directory: Path) -> dict[str, Any]:
        """Write every materialized array of ``options`` to ``directory/<key>.npy``.

        Returns the options with each array replaced by ``{"file": <absolute path>}``; the run
        snapshot stores that path relative to itself, and loading rebinds it after relocation.
        """
        directory.mkdir(parents=True, exist_ok=True)
        exported = {}
        for key, value in options.items():
            if isinstance(value, (np.ndarray, torch.Tensor)):
                path = directory / f"{key}.npy"
                np.save(path, np.asarray(value))
                value = {"file": str(path)}
            exported[key] = value
        return exported

    # -- what a task implements -------------------------------------------------------------

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        """Write new initial states, drawn from ``generator``, into ``rows``."""
        raise NotImplementedError

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance every row one step in place; return ``(reward [N], terminated [N])``."""
        raise NotImplementedError

    def _observe(self) -> Obs:
        """The current observation groups of every row (views are fine)."""
        raise NotImplementedError

    def _observe_rows(self, rows: torch.Tensor) -> Obs:
        """Owned copies of the observation groups of ``rows`` alone (final observations); a task whose
        observation is costly (an image) computes only these rows."""
        return take_rows(self._observe(), rows)

    def _episode_report(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Task scalars for the episodes that end in ``rows`` (read before their reset)."""
        return {}

    # -- the contract -----------------------------------------------------------------------

    def get_state(self) -> dict[str, torch.Tensor]:
        """Copies of every tensor that determines the env's future (plain tensors only)."""
        state = {key: getattr(self, key).detach().clone() for key in self.state_keys}
        state.update(
            episode_return=self.episode_return.clone(),
            episode_length=self.episode_length.clone(),
            generator=self.generator.get_state(),
        )
        return state

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``get_state`` returned (same number of rows)."""
        if state["episode_length"].shape != self.episode_length.shape:
            raise ValueError(
                f"{self.env_id}: saved env state has {state['episode_length'].shape[0]} rows, this env {self.num_envs}"
            )
        for key in self.state_keys:
            setattr(self, key, state[key].to(self.device).clone())
        self.episode_return = state["episode_return"].to(self.device).clone()
        self.episode_length = state["episode_length"].to(self.device).clone()
        self.generator.set_state(state["generator"])

    def reset(self, seed: int | None = None) -> Obs:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self._reset_state(self._all_rows, self.generator)
        self.episode_return.zero_()
        self.episode_length.zero_()
        return self._observe()

    def reset_rows(self, rows: torch.Tensor, seeds: Sequence[int]) -> Obs:
        rows = torch.as_tensor(rows, dtype=torch.int64, device=self.device).reshape(-1)
        if len(seeds) != rows.numel():
            raise ValueError(f"reset_rows: {rows.numel()} rows but {len(seeds)} seeds")
        for i, seed in enumerate(seeds):
            generator = torch.Generator(self.device)
            generator.manual_seed(int(seed))
            self._reset_state(rows[i : i + 1], generator)
        self.episode_return[rows] = 0.0
        self.episode_length[rows] = 0
        return self._observe()

    def step(self, actions: torch.Tensor) -> Step:
        check_actions(self, actions)
        reward, terminated = self._advance(actions)
        self.episode_return += reward
        self.episode_length += 1
        truncated = self.episode_length >= self.max_episode_steps
        done_rows = (terminated | truncated).nonzero().squeeze(1)
        if done_rows.numel() == 0:
            return Step(self._observe(), reward, terminated, truncated, done_rows, {}, {})
        final_obs = self._observe_rows(done_rows)
        episodes = {
            "return": self.episode_return.index_select(0, done_rows),
            "length": self.episode_length.index_select(0, done_rows),
            **self._episode_report(done_rows),
        }
        self._reset_state(done_rows, self.generator)
        self.episode_return.index_fill_(0, done_rows, 0.0)
        self.episode_length.index_fill_(0, done_rows, 0)
        return Step(self._observe(), reward, terminated, truncated, done_rows, final_obs, episodes)
