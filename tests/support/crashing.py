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


def lost_object():
    """A task whose result cannot be read, as an object lost with its node."""
    raise RuntimeError("the object was lost with its node")


class NaNRewards(CartPole):
    """CartPole whose reward is NaN in one row every ``every`` steps: a simulator that fails now and then."""

    env_id = "tests.support.crashing:NaNRewards"

    def __init__(self, num_envs: int, seed: int | None = None, every: int = 50, **kwargs):
        super().__init__(num_envs, seed, **kwargs)
        self.every, self.steps = every, 0

    def _advance(self, actions):
        reward, terminated = super()._advance(actions)
        self.steps += 1
        if self.steps % self.every == 0:
            reward = reward.clone()
            reward[(self.steps // self.every) % self.num_envs] = float("nan")
        return reward, terminated


class DiesAtStart(CartPole):
    """A CartPole whose process exits while it is built, once (``marker`` is created by the one that dies) and only
    outside the process ``driver_pid`` (the test's, which builds it to check it): a role that dies before it
    starts, as one placed on a node that is going."""

    env_id = "tests.support.crashing:DiesAtStart"

    def __init__(self, num_envs: int, seed: int | None = None, marker: str = "", driver_pid: int = 0, **kwargs):
        if marker and os.getpid() != driver_pid:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        super().__init__(num_envs, seed, **kwargs)
