"""Time-to-solve benchmark: PPO on CartPole until the first evaluation that passes, raysim and peers.

For each seed, every peer trains until an evaluation passes: 100 deterministic episodes, mean
return >= 475, evaluated every 10k env steps (the evaluation time is not counted). Reported per
seed: env steps and training seconds at that evaluation; for raysim also the Ray start-up and
actor creation, and the end-to-end time (start-up + training, evaluation excluded).

- ``raysim``: ``raysim.Trainer`` with the packaged ``cartpole_ppo`` config through Ray actors
  (shards, evaluation shard and learner), ``eval.every_steps=10000``, ``eval.stop_return=475``;
  a fresh embedded Ray per seed;
- ``CleanRL-style``: ``benchmarks/cleanrl_ppo.py`` (CleanRL ppo.py defaults), in this process;
- ``SB3``: Stable-Baselines3 PPO with the rl-zoo CartPole-v1 settings, when installed.

Run ``raysim bench solve`` or ``python benchmarks/solve.py`` in a checkout (``--seeds``, ``--peers``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

TARGET, EVAL_EVERY, EPISODES = 475.0, 10_000, 100
PEERS = ("raysim", "cleanrl", "sb3")


def solve_raysim(seed: int, overrides: list[str]) -> dict:
    """One raysim run through Ray actors, stopped at the first evaluation that passes."""
    import raysim

    with tempfile.TemporaryDirectory() as tmp:
        config = raysim.load_config(None, overrides=[
            f"seed={seed}", f"eval.every_steps={EVAL_EVERY}", f"eval.stop_return={TARGET}", f"eval.episodes={EPISODES}",
            "train.log_every=1000000", f"run_dir={tmp}/run", *overrides,
        ])
        start = time.perf_counter()
        summary = raysim.Trainer(config, sinks=[]).train()
        total = time.perf_counter() - start
    mean = summary.evaluation.mean_return if summary.evaluation else None
    return {"solved": mean is not None and mean >= TARGET, "env_steps": summary.env_steps,
            "train_seconds": summary.wall_time, "startup_seconds": summary.startup_time,
            "end_to_end": summary.startup_time + summary.wall_time, "wall_clock": total, "eval_return": mean}


def solve_cleanrl(seed: int) -> dict:
    module = _load_benchmark_module("cleanrl_ppo")
    result = module.train(seed, eval_every=EVAL_EVERY, target=TARGET, eval_episodes=EPISODES, max_steps=200_000)
    return {"solved": result["solved"], "env_steps": result["env_steps"], "train_seconds": result["train_seconds"],
            "eval_return": result["evals"][-1]["mean_return"] if result["evals"] else None}


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
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=linear(0.001), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)
    callback = EvalEvery()
    callback.started = time.perf_counter()
    model.learn(total_timesteps=100_000, callback=callback)
    steps, seconds, mean = callback.evals[-1] if callback.evals else (model.num_timesteps, float("nan"), None)
    del gym
    return {"solved": mean is not None and mean >= TARGET, "env_steps": steps, "train_seconds": seconds, "eval_return": mean}


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


def _load_benchmark_module(name: str):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"raysim_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raysim bench solve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--override", action="append", default=[], help="raysim config override (key=value), repeatable")
    args = parser.parse_args(argv)
    runners = {"raysim": lambda s: solve_raysim(s, args.override), "cleanrl": solve_cleanrl, "sb3": solve_sb3}
    skipped = {}
    if "sb3" in args.peers and importlib.util.find_spec("stable_baselines3") is None:
        skipped["sb3"] = "stable-baselines3 is not installed (pip install stable-baselines3)"
    results: dict[str, list[dict]] = {}
    for peer in args.peers:
        if peer in skipped:
            continue
        for seed in args.seeds:
            result = {"seed": seed, **runners[peer](seed)}
            results.setdefault(peer, []).append(result)
            print(f"[{peer} seed {seed}: {result}]", file=sys.stderr, flush=True)
    print("# Time to solve CartPole (PPO)\n")
    print(f"First evaluation with mean return >= {TARGET:g} over {EPISODES} deterministic episodes, evaluated every "
          f"{EVAL_EVERY:,} env steps; training seconds exclude evaluation; torch threads 1 (raysim: per actor).\n")
    print("| peer | seed | solved | env steps | training s | Ray start-up + actors s | end to end s |")
    print("|---|---|---|---|---|---|---|")
    for peer, rows in results.items():
        for r in rows:
            print(f"| {peer} | {r['seed']} | {'yes' if r['solved'] else 'NO'} | {_fmt(r['env_steps'])} | "
                  f"{_fmt(r['train_seconds'])} | {_fmt(r.get('startup_seconds'))} | {_fmt(r.get('end_to_end'))} |")
    print("\n## Medians\n")
    print("| peer | solved | median env steps | median training s | median start-up s | median end to end s |")
    print("|---|---|---|---|---|---|")
    for peer, rows in results.items():
        med = lambda key: statistics.median(r[key] for r in rows) if all(r.get(key) is not None for r in rows) else None  # noqa: E731
        print(f"| {peer} | {sum(r['solved'] for r in rows)}/{len(rows)} | {_fmt(med('env_steps'), 0)} | "
              f"{_fmt(med('train_seconds'))} | {_fmt(med('startup_seconds'))} | {_fmt(med('end_to_end'))} |")
    for peer, why in skipped.items():
        print(f"\nSkipped {peer}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
