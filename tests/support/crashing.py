"""A CartPole whose process dies once, at a chosen step: a shard killed in the middle of a rollout."""

from __future__ import annotations

import os
from pathlib import Path

from raysim.envs.cartpole import CartPole


class CrashOnce(CartPole):
    """Exits the process at env step ``crash_at`` unless ``marker`` exists (it is created first)."""

    env_id = "tests.support.crashing:CrashOnce"

    def __init__(self, num_envs: int, seed: int | None = None, crash_at: int = 10, marker: str = "", **kwargs):
        super().__init__(num_envs, seed, **kwargs)
        self.crash_at, self.marker, self.steps = crash_at, marker, 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.crash_at and self.marker and not Path(self.marker).exists():
            Path(self.marker).write_text("crashed once")
            os._exit(1)
        return super().step(actions)
