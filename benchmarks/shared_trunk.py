"""One PPO update of an Atari-sized batch: separate actor and critic CNNs against one shared trunk.

    python benchmarks/shared_trunk.py                       # CleanRL's ppo_atari.py batch: 8 x 128, 4 x 4
    python benchmarks/shared_trunk.py --steps 16 --epochs 1 --repeats 1   # a check of the script (seconds)

``Learner.update`` on a synthetic chunk of 4x84x84 uint8 frames (``envs`` x ``steps`` transitions,
no episode ending), Nature CNN, ``model.hidden_sizes: []`` (CleanRL's heads on the 512 features),
``update_epochs`` x 4 minibatches, with ``model.shared_encoders`` false and true, alternating,
medians; the update includes the critic's values for GAE. One torch thread by default.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from raysim.algos.ppo import PPOConfig
from raysim.learner import Learner
from raysim.models import ModelConfig
from raysim.rollout import RolloutChunk

SPACES = {"policy": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)}
ACTIONS = gym.spaces.Discrete(4)


def synthetic_chunk(steps: int, envs: int, seed: int = 0) -> RolloutChunk:
    """``steps`` x ``envs`` transitions of random frames and rewards; no episode ends."""
    g = torch.Generator().manual_seed(seed)
    flags = torch.zeros(steps, envs, dtype=torch.bool)
    return RolloutChunk(
        obs={"policy": torch.randint(0, 256, (steps + 1, envs, 4, 84, 84), generator=g, dtype=torch.uint8)},
        actions=torch.randint(0, 4, (steps, envs), generator=g),
        logp=torch.full((steps, envs), -float(np.log(4))),
        reward=torch.randn(steps, envs, generator=g),
        terminated=flags,
        truncated=flags,
        mask=~flags,
        final_obs={"policy": torch.zeros(0, 4, 84, 84, dtype=torch.uint8)},
        final_t=torch.zeros(0, dtype=torch.int64),
        final_row=torch.zeros(0, dtype=torch.int64),
        episodes={},
        policy_version=0,
    )


def learner(shared: bool, epochs: int) -> Learner:
    model = ModelConfig(actor_inputs=["policy"], cnn="nature", hidden_sizes=[], shared_encoders=shared)
    algo = PPOConfig(lr=2.5e-4, update_epochs=epochs, num_minibatches=4, clip_coef=0.1, ent_coef=0.01)
    return Learner(SPACES, ACTIONS, model, algo, horizon=10**6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128, help="steps per env (the chunk length)")
    parser.add_argument("--envs", type=int, default=8, help="envs (rows) of the chunk")
    parser.add_argument("--epochs", type=int, default=4, help="algo.update_epochs")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates of each (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chunk = synthetic_chunk(args.steps, args.envs)
    learners = {"separate": learner(False, args.epochs), "shared": learner(True, args.epochs)}
    times: dict[str, list[float]] = {name: [] for name in learners}
    for round_ in range(args.repeats + 1):
        for name, each in learners.items():
            start = time.perf_counter()
            each.update(chunk, log=False)
            if round_:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    separate, shared = (statistics.median(times[name]) for name in learners)
    samples = args.steps * args.envs
    print(
        f"one PPO update, {samples} samples of 4x84x84, {args.epochs} epochs x 4 minibatches, Nature CNN, "
        f"{args.threads} thread(s), median of {args.repeats}: separate {separate:.2f} s, shared {shared:.2f} s, "
        f"shared / separate {shared / separate:.2f} (separate takes {separate / shared:.2f}x as long)"
    )


if __name__ == "__main__":
    main()
