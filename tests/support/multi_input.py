"""Test-only batched envs with an image group: a native ``Spot`` and its Gymnasium twin ``GymSpot``.

``Spot``: a bright square sits in one of two halves of a ``size`` x ``size`` RGB image; the agent is
paid for naming the half (action 0: left, 1: right). Observations: ``camera`` (uint8 image,
``layout`` ``hwc`` or ``chw``; ``image_dtype: float32`` gives the same values as a float32 vector
group, for byte comparisons), ``joints`` (a float32 vector: a step counter and noise) and ``critic``
(privileged: the answer itself). Episodes last ``max_episode_steps`` steps. The answer is in the
image only, so the actor needs its CNN to do better than chance.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import Obs
from raysim.envs.torch_env import TorchEnv


class Spot(TorchEnv):
    """Which half is the bright square in? ``camera`` + ``joints`` for the actor, ``critic`` privileged."""

    env_id = "tests.support.multi_input:Spot"
    state_keys = ("side", "t")

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        size: int = 16,
        layout: str = "hwc",
        image_dtype: str = "uint8",
        max_episode_steps: int = 8,
    ):
        super().__init__(num_envs, seed, max_episode_steps)
        self.size, self.layout, self.image_dtype = size, layout, image_dtype
        shape = (size, size, 3) if layout == "hwc" else (3, size, size)
        dtype = np.uint8 if image_dtype == "uint8" else np.float32
        self.observation_spaces = {
            "camera": gym.spaces.Box(0, 255, shape, dtype),
            "joints": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "critic": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
        }
        self.action_space = gym.spaces.Discrete(2)
        self.side = torch.zeros(num_envs, dtype=torch.int64)
        self.t = torch.zeros(num_envs)

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        self.side[rows] = torch.randint(0, 2, (rows.numel(),), generator=generator)
        self.t[rows] = 0.0

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reward = (actions == self.side).float()
        self.side = torch.randint(0, 2, (self.num_envs,), generator=self.generator)
        self.t += 1
        return reward, torch.zeros(self.num_envs, dtype=torch.bool)

    def _observe(self) -> Obs:
        n, s = self.num_envs, self.size
        image = torch.full((n, s, s, 3), 20, dtype=torch.uint8)
        half, q = s // 2, s // 4
        for side in (0, 1):
            rows = (self.side == side).nonzero().squeeze(1)
            image[rows, q : q + half // 2 + 1, side * half + 1 : side * half + half - 1] = 230
        if self.layout == "chw":
            image = image.permute(0, 3, 1, 2)
        image = image.contiguous() if self.image_dtype == "uint8" else image.float()
        joints = torch.stack([self.t / 8, torch.zeros(n)], 1)
        return {"camera": image, "joints": joints, "critic": self.side.float().unsqueeze(1)}


class GymSpot(gym.Env):
    """One row of ``Spot`` as a Gymnasium env with a ``Dict`` space (for the adapter)."""

    def __init__(self, size: int = 16):
        self.inner = Spot(1, 0, size=size)
        self.observation_space = gym.spaces.Dict(self.inner.observation_spaces)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(self.inner.reset(seed)), {}

    def step(self, action):
        step = self.inner.step(torch.tensor([int(action)]))
        return self._obs(step.obs), float(step.reward[0]), False, bool(step.truncated[0]), {}

    @staticmethod
    def _obs(obs: Obs) -> dict:
        return {k: v[0].numpy().copy() for k, v in obs.items()}


gym.register("RaysimTest/Spot-v0", entry_point=GymSpot, max_episode_steps=8)


def tiny_spot_run(run_dir, *overrides: str) -> list[str]:
    """The overrides of a tiny in-process PPO run on ``Spot`` (camera and joints for the actor, obs_norm on), then
    ``overrides`` (later ones win)."""
    return [
        "backend=local",
        "env.id=tests.support.multi_input:Spot",
        "env.num_envs=8",
        "algo.num_steps=16",
        "algo.update_epochs=2",
        "train.total_steps=256",
        "eval.episodes=0",
        "model.actor_inputs=[camera, joints]",
        "model.obs_norm=true",
        f"run_dir={run_dir}",
        *overrides,
    ]
