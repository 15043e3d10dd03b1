"""``SleepingCartPole``: CartPole whose batched step also costs wall time without using the CPU.

A remote simulator, or a heavy physics engine on another node, makes a shard wait rather than compute;
sleeping models that on a small machine, so that the scale benchmark measures raysim's collection and
overlap rather than this machine's cores. Env id ``raysim.bench.sleeping:SleepingCartPole``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from raysim.envs.cartpole import CartPole
from raysim.envs.contract import Step


class SleepingCartPole(CartPole):
    """Each batched step sleeps ``step_seconds``; with probability ``slow_prob`` a run of ``chunk_steps`` steps
    (a chunk) sleeps ``slow_factor`` times longer: a straggler, drawn from the env's seed."""

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        max_episode_steps: int = 500,
        device: str = "cpu",
        initial_states: Any = None,
        step_seconds: float = 0.01,
        chunk_steps: int = 32,
        slow_prob: float = 0.0,
        slow_factor: float = 5.0,
    ):
        super().__init__(num_envs, seed, max_episode_steps, device, initial_states)
        self.step_seconds, self.chunk_steps = step_seconds, chunk_steps
        self.slow_prob, self.slow_factor = slow_prob, slow_factor
        self.straggler = random.Random(seed)
        self.steps, self.delay = 0, step_seconds

    def step(self, actions: torch.Tensor) -> Step:
        if self.steps % self.chunk_steps == 0:
            slow = self.slow_prob > 0 and self.straggler.random() < self.slow_prob
            self.delay = self.step_seconds * (self.slow_factor if slow else 1.0)
        self.steps += 1
        time.sleep(self.delay)
        return super().step(actions)
