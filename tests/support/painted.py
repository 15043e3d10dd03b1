"""Gymnasium envs for video tests: ``RaysimTest/Painted-v0`` draws, in ``rgb_array`` mode, a picture whose grey
level says the step of its episode (``grey(t)``); its episodes last 3..12 steps (drawn at reset). ``RaysimTest/
Blind-v0`` draws nothing and takes no ``render_mode``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

PICTURE = (16, 24)  # height, width


def grey(t: int) -> int:
    """The grey level of the picture of an episode's step ``t`` (0: its first state)."""
    return 40 + 15 * t


class Painted(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t, self.length = 0, 1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(3, 13))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= self.length, False, {}

    def render(self):
        return np.full((*PICTURE, 3), grey(self.t), np.uint8) if self.render_mode == "rgb_array" else None

    def _obs(self) -> np.ndarray:
        return np.array([self.t / 12, self.length / 12], np.float32)


class Blind(Painted):
    metadata = {"render_modes": []}

    def __init__(self):
        super().__init__(None)


for name, cls in (("Painted", Painted), ("Blind", Blind)):
    if f"RaysimTest/{name}-v0" not in gym.registry:
        gym.register(f"RaysimTest/{name}-v0", entry_point=cls, max_episode_steps=50)
