"""Test-only ``Coin``: a fast, seeded batched env whose success probability is a knob (GRPO on success).

At each step a row succeeds with probability ``p`` when it takes action 1 and ``p ** 2`` when it takes
action 0 (p = 0: never, p = 1: always, at the first step), drawn from the env's generator. A success pays
1 and ends the episode (``terminated``, report ``success`` True); an episode that runs out of
``max_episode_steps`` is truncated with return 0. The ``policy`` group is a context drawn at the reset,
from the reset seed (equal seeds, equal starts: GRPO groups share them), and the step count.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import Obs
from raysim.envs.torch_env import TorchEnv


class Coin(TorchEnv):
    """A coin per step: action 1 wins with probability ``p``, action 0 with ``p ** 2``; a win ends the episode."""

    env_id = "tests.support.coin:Coin"
    defines_success = True
    state_keys = ("context",)

    def __init__(self, num_envs: int, seed: int | None = None, p: float = 0.5, max_episode_steps: int = 4):
        super().__init__(num_envs, seed, max_episode_steps)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{self.env_id}: p must be in [0, 1], got {p!r}")
        self.p = float(p)
        self.observation_spaces = {"policy": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)}
        self.action_space = gym.spaces.Discrete(2)
        self.context = torch.zeros(self.num_envs)
        self.won = torch.zeros(self.num_envs, dtype=torch.bool)

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        self.context[rows] = torch.rand(rows.numel(), generator=generator)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chance = torch.where(actions == 1, self.p, self.p**2)
        self.won = torch.rand(self.num_envs, generator=self.generator) < chance
        return self.won.float(), self.won.clone()

    def _observe(self) -> Obs:
        steps = self.episode_length.float() / self.max_episode_steps
        return {"policy": torch.stack([self.context, steps], 1)}

    def _episode_report(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": self.won.index_select(0, rows)}
