"""The time-to-solve benchmark's peers: a CleanRL-style PPO (``cleanrl_ppo.py``) and Stable-Baselines3's PPO.

``raysim bench solve`` (``raysim/bench/solve.py``) imports this file from the source tree and runs
these beside raysim, with the same target and evaluation.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from raysim.bench.peers import peer_module
from raysim.bench.solve import EPISODES, EVAL_EVERY, TARGET


def solve_cleanrl(seed: int) -> dict:
    module = peer_module("cleanrl_ppo")
    result = module.train(seed, eval_every=EVAL_EVERY, target=TARGET, eval_episodes=EPISODES, max_steps=200_000)
    return {
        "solved": result["solved"],
        "env_steps": result["env_steps"],
        "train_seconds": result["train_seconds"],
        "eval_return": result["evals"][-1]["mean_return"] if result["evals"] else None,
    }


def solve_sb3(seed: int) -> dict:
    """SB3 PPO, rl-zoo's CartPole-v1 hyperparameters (ppo.yml), evaluated by a callback."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    def linear(start: float):
        return lambda progress: progress * start

    class EvalEvery(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next, self.eval_time, self.evals = EVAL_EVERY, 0.0, []

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next:
                return True
            t0 = time.perf_counter()
            mean = _evaluate_sb3(self.model, seed)
            self.eval_time += time.perf_counter() - t0
            self.evals.append((self.num_timesteps, time.perf_counter() - self.started - self.eval_time, mean))
            self.next += EVAL_EVERY
            return mean < TARGET

    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(0.001),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    callback = EvalEvery()
    callback.started = time.perf_counter()
    model.learn(total_timesteps=100_000, callback=callback)
    steps, seconds, mean = callback.evals[-1] if callback.evals else (model.num_timesteps, float("nan"), None)
    del gym
    return {
        "solved": mean is not None and mean >= TARGET,
        "env_steps": steps,
        "train_seconds": seconds,
        "eval_return": mean,
    }


def _evaluate_sb3(model, seed: int) -> float:
    import gymnasium as gym

    envs = gym.make_vec("CartPole-v1", EPISODES, vectorization_mode="vector_entry_point")
    obs, _ = envs.reset(seed=10_000 + seed)
    returns, alive = np.zeros(EPISODES), np.ones(EPISODES, dtype=bool)
    while alive.any():
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, term, trunc, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(term | trunc)
    envs.close()
    return float(returns.mean())
