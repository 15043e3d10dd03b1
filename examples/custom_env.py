"""Bring your own env: a batched torch task with a camera and a joint vector, trained by its import path. The recipe:
docs/tasks/bring-your-own-env.md.

    python -m examples.custom_env            # the full run (from the checkout's root)
    python -m examples.custom_env --quick    # a tiny budget: seconds

Run it as a module from the checkout's root (or with the root on PYTHONPATH): the config names the env
``examples.custom_env:Spot``, which the driver and every shard's Ray worker import by that name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import raysim
from raysim.envs.contract import Obs
from raysim.envs.torch_env import TorchEnv


class Spot(TorchEnv):
    """Which half of the picture is the bright square in? Answer at every step: 0 left, 1 right.

    Observation groups: ``camera``, a uint8 ``[size, size, 3]`` image, and ``joints``, a float32 vector (the
    fraction of the episode played and the last answer). A right answer pays 1 and draws a new square; a wrong one
    ends the episode (terminated: a failure). An episode that answers every one of its ``max_episode_steps`` steps
    right is cut there (truncated: a success). The square is in the image only: the policy needs its CNN.
    """

    env_id = "examples.custom_env:Spot"
    defines_success = True  # every episode report carries ``success``: evaluation reports k/n
    state_keys = ("side", "last_answer", "wrong")  # with the episode counters: the whole state (checkpoints)

    def __init__(self, num_envs: int, seed: int | None = None, size: int = 16, max_episode_steps: int = 8):
        super().__init__(num_envs, seed, max_episode_steps)
        self.size = size
        self.observation_spaces = {
            "camera": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),  # uint8, 3 dimensions: an image
            "joints": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
        self.action_space = gym.spaces.Discrete(2)
        self.side = torch.zeros(num_envs, dtype=torch.int64)  # where the square is: 0 left, 1 right
        self.last_answer = torch.zeros(num_envs)
        self.wrong = torch.zeros(num_envs, dtype=torch.bool)

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        self.side[rows] = torch.randint(0, 2, (rows.numel(),), generator=generator)
        self.last_answer[rows] = 0.0
        self.wrong[rows] = False

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.wrong = actions != self.side
        self.last_answer = actions.float()
        self.side = torch.randint(0, 2, (self.num_envs,), generator=self.generator)
        return (~self.wrong).float(), self.wrong.clone()  # reward [N], terminated [N]

    def _observe(self) -> Obs:
        image = torch.full((self.num_envs, self.size, self.size, 3), 20, dtype=torch.uint8)
        half, quarter = self.size // 2, self.size // 4
        for side in (0, 1):
            rows = (self.side == side).nonzero().squeeze(1)
            image[rows, quarter : quarter + half, side * half + 1 : (side + 1) * half - 1] = 230
        played = self.episode_length.float() / self.max_episode_steps
        return {"camera": image, "joints": torch.stack([played, self.last_answer], 1)}

    def _episode_report(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": ~self.wrong.index_select(0, rows)}

    def frames(self, size: int) -> torch.Tensor:
        """Every row's camera image, enlarged to about ``size`` pixels per side (videos: ``raysim eval --video``)."""
        scale = max(1, size // self.size)
        return self._observe()["camera"].repeat_interleave(scale, 1).repeat_interleave(scale, 2)


class GymSpot(gym.Env):
    """The same task as one Gymnasium env (one row, NumPy): what the ``gym:`` route trains, batched by Gymnasium.

    Its ``Dict`` space becomes the ``camera`` and ``joints`` groups; ``info["is_success"]`` at an episode's last
    step becomes its success."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 16, max_episode_steps: int = 8, render_mode: str | None = None):
        self.size, self.max_episode_steps, self.render_mode = size, max_episode_steps, render_mode
        self.observation_space = gym.spaces.Dict(
            {
                "camera": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
                "joints": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.side, self.steps, self.last_answer = int(self.np_random.integers(2)), 0, 0.0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        right = int(action) == self.side
        self.steps, self.last_answer = self.steps + 1, float(action)
        self.side = int(self.np_random.integers(2))
        truncated = right and self.steps >= self.max_episode_steps
        return self._obs(), float(right), not right, truncated, {"is_success": truncated}

    def render(self) -> np.ndarray:
        return self._obs()["camera"]

    def _obs(self) -> dict:
        image = np.full((self.size, self.size, 3), 20, np.uint8)
        half, quarter = self.size // 2, self.size // 4
        image[quarter : quarter + half, self.side * half + 1 : (self.side + 1) * half - 1] = 230
        joints = np.array([self.steps / self.max_episode_steps, self.last_answer], np.float32)
        return {"camera": image, "joints": joints}


if "examples/Spot-v0" not in gym.registry:  # once per process (``python -m`` imports this file twice: as __main__ too)
    gym.register("examples/Spot-v0", entry_point=GymSpot)


def train(overrides: list[str]) -> None:
    """Train PPO on Spot as ``spot_ppo.yaml`` and ``overrides`` say; print the final evaluation's success k/n."""
    config = raysim.load_config(Path(__file__).with_name("spot_ppo.yaml"), overrides)
    summary = raysim.Trainer(config).train()
    report = summary.evaluation
    low, high = report.success_per_requested.interval
    print(f"{config.env.id}: {summary.env_steps} env steps, run directory {summary.run_dir}")
    print(f"evaluation: success {report.successes}/{report.requested} [{low:.3f}, {high:.3f}] 95% Wilson")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", help="where the runs are written (default: runs/, as raysim train)")
    args = parser.parse_args(argv)
    for group, space in Spot(1).observation_spaces.items():
        print(f"observation group {group}: {space.dtype} {space.shape}")
    quick = ["backend=local", "train.total_steps=1024", "eval.episodes=8"] if args.quick else []
    # the Gymnasium route names the module that registers the id: the driver and every Ray worker import it
    routes = {"spot_ppo": "examples.custom_env:Spot", "gym_spot_ppo": "gym:examples.custom_env:examples/Spot-v0"}
    for name, env_id in routes.items():
        train([f"name={name}", f"env.id={env_id}", *quick, *([f"run_dir={args.out}/{name}"] if args.out else [])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
