"""Native batched CartPole: Gymnasium's CartPole-v1 physics for N rows at once in torch tensors.

Same constants, Euler integration, termination thresholds (|x| > 2.4, |theta| > 12 degrees),
reward 1 on every step (the terminal one included) and initial states uniform in [-0.05, 0.05].
Truncation at ``max_episode_steps`` (500, as CartPole-v1's TimeLimit).

Option ``initial_states``: a fixed table of initial states (a task resource) that resets draw
rows from, declared as ``{generate: K, seed: S}`` (materialized once, deterministically), as
``{file: table.npy}``, or given as an array [K, 4].
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import Obs
from raysim.envs.torch_env import TorchEnv

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_LENGTH = 0.5
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPole(TorchEnv):
    """``raysim/CartPole``: observation group ``policy`` = (x, x_dot, theta, theta_dot)."""

    env_id = "raysim/CartPole"
    state_keys = ("state",)

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        max_episode_steps: int = 500,
        device: str = "cpu",
        initial_states: Any = None,
    ):
        super().__init__(num_envs, seed, max_episode_steps, device)
        table = self.materialize({"initial_states": initial_states})["initial_states"]
        self.initial_states = None if table is None else torch.as_tensor(table, dtype=torch.float32, device=self.device)
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        self.observation_spaces = {"policy": gym.spaces.Box(-high, high, dtype=np.float32)}
        self.action_space = gym.spaces.Discrete(2)
        self.state = torch.zeros(self.num_envs, 4, device=self.device)
        self.reset(seed)

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        spec = options.get("initial_states")
        if isinstance(spec, dict) and "generate" in spec:
            rng = np.random.default_rng(int(spec.get("seed", 0)))
            spec = rng.uniform(-0.05, 0.05, size=(int(spec["generate"]), 4)).astype(np.float32)
        elif isinstance(spec, dict) and "file" in spec:
            spec = np.load(spec["file"])
        elif spec is not None:
            spec = np.asarray(spec, dtype=np.float32)
        if spec is not None and (spec.ndim != 2 or spec.shape[1] != 4):
            raise ValueError(f"raysim/CartPole: initial_states must be a [K, 4] table, got shape {spec.shape}")
        options["initial_states"] = spec
        return options

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        if self.initial_states is not None:
            pick = torch.randint(len(self.initial_states), (rows.numel(),), generator=generator, device=self.device)
            self.state[rows] = self.initial_states[pick]
            return
        fresh = torch.rand(rows.numel(), 4, generator=generator, device=self.device)
        self.state[rows] = fresh * 0.1 - 0.05

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = actions.to(self.state.dtype) * (2 * FORCE_MAG) - FORCE_MAG
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot.square() * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos.square() / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        self.state = torch.stack(
            (x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc), 1
        )
        terminated = (self.state[:, 0].abs() > X_THRESHOLD) | (self.state[:, 2].abs() > THETA_THRESHOLD)
        return torch.ones(self.num_envs, device=self.device), terminated

    def _observe(self) -> Obs:
        return {"policy": self.state}
