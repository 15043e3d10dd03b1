"""Meta-World collection benchmark: a raysim shard against a bare loop and a CleanRL-style loop, side by side.

All three collect the same task (``--task``, reach-v3 by default) on the same number of rows N (``--envs``, 8)
in chunks of T steps (``--steps``, 256), one torch thread, with the packaged ``metaworld_reach_ppo``'s network
shape (Tanh [64, 64] actor and critic, Gaussian actions):

- ``raysim``: an ``EnvShard`` of ``raysim/MetaWorld`` in this process, built from the packaged config (its
  model, its env options, the task and N put in), collecting as training does: ``shard.rollout(weights, T)``
  with a new weights version each chunk, then ``chunk_values(critic, chunk)`` on the learner's side
  (``raysim bench collect``'s in-process row);
- ``bare loop``: N raw Sawyer envs built as ``raysim/MetaWorld`` builds a row, stepped by a Python loop: one
  actor forward on the stacked observations, sample, clip, step each env, reset an env at truncation. Nothing
  is stored, no log-probability or value: the least an honest hand-written loop does;
- ``CleanRL-style``: CleanRL ``ppo_continuous_action.py``'s collection over Gymnasium's ``SyncVectorEnv`` of
  ``Meta-World/MT1`` envs with CleanRL's wrappers and storage, the value of the next observation at the end
  (``benchmarks/cleanrl_ppo_metaworld_collect.py``; only where the source tree is present).

Each of ``--repeats`` (3) repeats measures every contestant in turn, in an order that rotates each repeat (the
load of the machine drifts): one warm-up chunk, then env steps/s over ``--chunks`` (8) chunks. Reported: each
repeat's figures and their medians, raysim / bare and raysim / CleanRL-style per repeat and of the medians; the
same per CPU second of this process (process time), which other work on a loaded machine moves less than the
wall clock.

``raysim bench metaworld`` (``--task``, ``--envs``, ``--steps``, ``--chunks``, ``--repeats``, ``--seed``; needs
``pip install "raysim[metaworld]"``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from raysim.bench.peers import MISSING, peer_module
from raysim.bench.results import installed_version

CONFIG = "metaworld_reach_ppo"
RAYSIM, BARE, CLEANRL = "raysim", "bare loop", "CleanRL-style"
Rates = dict[str, list[float]]  # contestant -> one figure per repeat


@dataclass
class Contestant:
    """One collector: ``chunk()`` collects T steps on the N rows; ``close()`` frees it."""

    name: str
    chunk: Callable[[], object]
    close: Callable[[], None]


def raysim_contestant(args: argparse.Namespace) -> Contestant:
    """The packaged config's shard in this process, with the learner side's values (``raysim bench collect``'s
    in-process row)."""
    import raysim
    from raysim.bench.collect import inproc_row
    from raysim.envs.registry import materialize

    config = raysim.load_config(CONFIG, [f"env.kwargs.tasks={args.task}", f"env.num_envs={args.envs}"])
    env_kwargs = materialize(config.env.id, config.env.kwargs)
    _, row = inproc_row(RAYSIM, args.envs, args.steps, args.seed, config.model, config.env.id, env_kwargs)
    versions = itertools.count(1)  # a new weights version every chunk, as in training: the shard loads them
    return Contestant(RAYSIM, lambda: row.collect(next(versions)), row.close)


class BareLoop:
    """N raw Sawyer envs stepped by a Python loop with actions of a Tanh [64, 64] Gaussian actor (see the module)."""

    def __init__(self, task: str, num_envs: int, steps: int, seed: int, max_episode_steps: int = 500):
        from raysim.envs.meta_world import OBS_SIZE

        self.envs = [sawyer_env(task, max_episode_steps) for _ in range(num_envs)]
        for i, env in enumerate(self.envs):  # a goal drawn from the task's goal space at each reset
            env._freeze_rand_vec, env.seeded_rand_vec, env.np_random = False, True, np.random.default_rng(seed + i)
        torch.manual_seed(seed)
        self.actor = torch.nn.Sequential(
            torch.nn.Linear(OBS_SIZE, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 4),
        )
        self.std = torch.ones(4)
        self.steps = steps
        self.obs = np.stack([env.reset()[0] for env in self.envs]).astype(np.float32)

    def __call__(self) -> None:
        obs = self.obs
        with torch.no_grad():
            for _ in range(self.steps):
                mean = self.actor(torch.from_numpy(obs))
                action = torch.normal(mean, self.std).clamp_(-1.0, 1.0).numpy()
                for i, env in enumerate(self.envs):
                    obs[i], _, terminated, truncated, _ = env.step(action[i])
                    if terminated or truncated:
                        obs[i] = env.reset()[0]

    def close(self) -> None:
        for env in self.envs:
            env.close()


def sawyer_env(task: str, max_episode_steps: int):
    """One Sawyer env of ``task`` as ``raysim/MetaWorld`` builds a row (``MetaWorld._build``): goal-observable,
    reward v2, allowed the step limit."""
    import pickle

    from raysim.envs.meta_world import import_metaworld

    import_metaworld()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.types import Task

    cls = ALL_V3_ENVIRONMENTS[task]
    env = cls(reward_function_version="v2")
    data = {"env_cls": cls, "rand_vec": np.zeros(0), "partially_observable": False}
    env.set_task(Task(env_name=task, data=pickle.dumps(data)))
    env.max_path_length = max_episode_steps
    return env


def contestants(args: argparse.Namespace, built: list[Contestant]) -> dict[str, str]:
    """The three contestants, built into ``built`` (construction is not measured; the caller closes them, a
    failure halfway included); the skipped ones and why."""
    built.append(raysim_contestant(args))
    bare = BareLoop(args.task, args.envs, args.steps, args.seed)
    built.append(Contestant(BARE, bare, bare.close))
    peer = peer_module("cleanrl_ppo_metaworld_collect")
    if peer is None:
        return {CLEANRL: MISSING}
    collection = peer.Collection(args.task, args.envs, args.steps, args.seed)
    built.append(Contestant(CLEANRL, collection, collection.close))
    return {}


def measure(built: list[Contestant], args: argparse.Namespace) -> tuple[Rates, Rates]:
    """Env steps per second of each contestant per repeat, of wall time and of this process's CPU time, the order
    rotating every repeat: a warm-up chunk, then ``--chunks`` timed chunks."""
    wall: Rates = {c.name: [] for c in built}
    cpu: Rates = {c.name: [] for c in built}
    steps = args.chunks * args.steps * args.envs
    for repeat in range(args.repeats):
        shift = repeat % len(built)
        for contestant in built[shift:] + built[:shift]:
            contestant.chunk()
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.chunks):
                contestant.chunk()
            wall[contestant.name].append(steps / (time.perf_counter() - start))
            cpu[contestant.name].append(steps / max(time.process_time() - start_cpu, 1e-9))
    return wall, cpu


def report(rates: Rates, args: argparse.Namespace, unit: str = "env steps/s") -> str:
    """One row per repeat and the medians: each contestant's ``unit``, raysim / bare, raysim / CleanRL-style."""
    names = list(rates)
    ratios = [name for name in (BARE, CLEANRL) if name in rates]
    header = ["repeat", *(f"{name} {unit}" for name in names), *(f"{RAYSIM} / {name}" for name in ratios)]

    def line(label: str, figures: dict[str, float]) -> list[str]:
        return [
            label,
            *(f"{figures[name]:,.0f}" for name in names),
            *(f"{figures[RAYSIM] / figures[name]:.2f}x" for name in ratios),
        ]

    body = [line(str(r + 1), {name: rates[name][r] for name in names}) for r in range(args.repeats)]
    body.append(line("median", {name: statistics.median(rates[name]) for name in names}))
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    rows = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in (header, *body)]
    rows.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(rows)


def _load() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine moves the figures."""
    try:
        return ", ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench metaworld", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="reach-v3", help="Meta-World v3 task (default reach-v3)")
    parser.add_argument("--envs", type=int, default=8, help="rows N of every contestant (default 8)")
    parser.add_argument("--steps", type=int, default=256, help="steps T per chunk (default 256)")
    parser.add_argument("--chunks", type=int, default=8, help="timed chunks per measurement (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.envs, args.steps, args.chunks, args.repeats) < 1:
        parser.error("--envs, --steps, --chunks and --repeats must be >= 1")
    from raysim.envs.errors import MissingDependencyError
    from raysim.envs.meta_world import task_list

    try:
        task_list("MT1", args.task)
    except (MissingDependencyError, ValueError) as error:
        parser.error(f"--task {args.task}: {error}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    threads, rng_state = torch.get_num_threads(), torch.random.get_rng_state()
    torch.set_num_threads(1)
    load_start = _load()
    built: list[Contestant] = []
    try:
        skipped = contestants(args, built)
        threads_used = torch.get_num_threads()
        wall, cpu = measure(built, args)
    finally:
        for contestant in built:
            contestant.close()
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng_state)
    print("# raysim Meta-World collection benchmark")
    print()
    print(
        f"{args.task}, N = {args.envs} rows, T = {args.steps} steps a chunk, {args.chunks} timed chunks after a "
        f"warm-up chunk, {args.repeats} repeats in rotating order."
    )
    print(
        f"torch {torch.__version__} ({threads_used} thread), MuJoCo {installed_version('mujoco')}, metaworld "
        f"{installed_version('metaworld')}, gymnasium {installed_version('gymnasium')}; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs; load average at the start {load_start}, at the end "
        f"{_load()}"
    )
    print()
    print(report(wall, args))
    print()
    print("Per CPU second of this process (its process time: less moved by other work on the machine than the wall")
    print("clock, which the figures above are per):")
    print()
    print(report(cpu, args, "env steps per CPU s"))
    for name, why in skipped.items():
        print(f"\nSkipped {name}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
