"""Atari benchmark: raysim's packaged ``breakout_ppo`` against a CleanRL-style peer, side by side in one run.

Both train Breakout with CleanRL ``ppo_atari.py``'s settings (8 envs x 128 steps, 4 epochs, 4
minibatches, lr 2.5e-4 annealed, clip 0.1, entropy 0.01, the Nature CNN) for the same budget
(``--steps``, 30k env steps by default): ``raysim`` is ``raysim.Trainer`` on the packaged config
(its shards and learner as Ray actors, the budget overridden, no evaluation), the peer is
``benchmarks/cleanrl_ppo_atari.py`` in this process. Before that, collection alone (acting and env
steps, nothing learned): raysim's shard collecting chunks in this process with a fixed policy
(``EnvShard.rollout``, as ``raysim bench collect`` measures it, with the run's rows in one shard),
and the peer's rollout phase with its initial policy, in alternating rounds (medians); where ``envpool``
is installed, a third side: CleanRL ``ppo_atari_envpool.py``'s env (EnvPool's C++ Atari, ``Breakout-v5``
without sticky actions, its pool on one thread) acted on by the peer's agent. Then the envs alone, with
random actions (raysim's env as its shard builds it, the peer's wrapped envs, EnvPool's), in alternating
rounds too: where the time goes, env or acting. EnvPool is a measured peer, not a raysim backend
(docs/environments.md).

Reported: env steps/s of collection (and the cores it kept busy: CPU over wall time, env threads
included) and of training, training seconds, the training return as the raw game score (whole games:
the mean of the last 10 finished games; a random policy scores about 1.7 at Breakout), raysim / peer
ratios, and the threads each used.

``raysim bench atari`` (``--steps``, ``--peer-threads``, ``--rounds``, ``--round-steps``; needs
``pip install -e ".[atari]"`` and the source tree's ``benchmarks/`` for the peer; EnvPool's rows: ``pip install
envpool``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from raysim.bench.peers import MISSING, peer_module

CONFIG = "breakout_ppo"
RANDOM_SCORE = 1.7  # Breakout, a uniformly random policy's raw game score (about)
LAST_GAMES = 10
ENVPOOL = "EnvPool"
#: Ray starts its workers with niceness 15; side by side with the in-process peer, all run at 0.
SIDE_BY_SIDE = {"worker_niceness": 0}
Found = dict[str, dict[str, list[float]]]  # "rates" and "cores": per side, one value per measured round


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench atari", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30_000, help="env steps of each training run (default 30,000)")
    parser.add_argument("--config", default=CONFIG, help="raysim's config: packaged name or YAML file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peer-threads", type=int, default=1, help="the peer's torch threads (default 1)")
    parser.add_argument("--peer-env-id", default=None, help="the peer's env (default BreakoutNoFrameskip-v4)")
    parser.add_argument("--peer-device", default="cpu", help="the peer's network device (cuda on a GPU machine)")
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds of collection alone (default 8)")
    parser.add_argument("--warmups", type=int, default=1, help="discarded rounds of collection alone (default 1)")
    parser.add_argument(
        "--round-steps",
        type=int,
        default=None,
        help="steps of each row per round (default: the config's algo.num_steps)",
    )
    parser.add_argument("--no-training", action="store_true", help="collection alone only")
    parser.add_argument("--out", type=Path, default=Path("bench-results/atari"), help="results folder")
    parser.add_argument(
        "--override", action="append", default=[], help="raysim config override (key=value), repeatable"
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.rounds, args.peer_threads, args.round_steps or 1) < 1 or args.warmups < 0:
        parser.error("--steps, --rounds, --round-steps and --peer-threads must be >= 1 and --warmups >= 0")
    return args


def load(args: argparse.Namespace):
    """raysim's config with the budget and seed overridden, no evaluation, metrics in parquet."""
    import raysim

    run_dir = args.out / "runs" / f"raysim-s{args.seed}-{args.steps}"
    overrides = [
        f"seed={args.seed}",
        f"train.total_steps={args.steps}",
        "eval.episodes=0",
        "train.log_every=1",
        "train.sinks=[parquet]",
        f"run_dir={run_dir}",
    ]
    return raysim.load_config(args.config, [*overrides, *args.override])


def start_ray(config) -> bool:
    """An embedded Ray sized for the run's roles, workers not niced; False when one was already up."""
    import ray

    from raysim.coordinator.cluster import needs, total

    if ray.is_initialized():
        return False
    cpus = max(os.cpu_count() or 1, math.ceil(total(needs(config)).get("CPU", 1.0)))
    ray.init(
        address="local", num_cpus=cpus, include_dashboard=False, logging_level="ERROR", _system_config=SIDE_BY_SIDE
    )
    return True


class ThreadProbe:
    """A Ray actor asking for what a learner rank asks: the torch threads a learner gets there."""

    def threads(self) -> int:
        return torch.get_num_threads()


def raysim_threads(config) -> str:
    """The torch threads of raysim's roles: shards set one; a learner rank's come from Ray (its CPUs)."""
    if config.backend == "local":
        return f"shards and learner in this process: {torch.get_num_threads()}"
    import ray

    probe = ray.remote(ThreadProbe).options(num_cpus=config.learner.num_cpus).remote()
    try:
        learner = ray.get(probe.threads.remote())
    finally:
        ray.kill(probe)
    return f"shard 1, learner {learner} (learner.num_cpus {config.learner.num_cpus:g})"


def envpool_installed() -> bool:
    """Whether EnvPool's row can be measured (``pip install envpool``; not a raysim dependency)."""
    return importlib.util.find_spec("envpool") is not None


def round_steps(config, args: argparse.Namespace) -> int:
    return args.round_steps or config.algo.num_steps


def alternate(steppers: dict, args: argparse.Namespace) -> Found:
    """Per measured round of each stepper, in rounds that alternate their order: env steps/s, and the cores
    used (this process's CPU time over the wall time: env threads count, whatever their kind)."""
    found: Found = {"rates": {}, "cores": {}}
    for rnd in range(args.warmups + args.rounds):
        names = list(steppers)[rnd % len(steppers) :] + list(steppers)[: rnd % len(steppers)]
        for name in names:
            start, cpu = time.perf_counter(), time.process_time()
            steps = steppers[name]()
            wall = time.perf_counter() - start
            if rnd >= args.warmups:
                found["rates"].setdefault(name, []).append(steps / wall)
                found["cores"].setdefault(name, []).append((time.process_time() - cpu) / wall)
    return found


def raysim_env(config):
    """raysim's env as its shard builds it (``EnvShard``): the run's rows in one."""
    from raysim.envs import make, stacked
    from raysim.envs.registry import materialize

    rows = config.env.num_envs * config.shards.count
    env = make(config.env.id, rows, seed=config.seed, **materialize(config.env.id, config.env.kwargs))
    return stacked(env, config.env.frame_stack)


def collection_alone(config, args: argparse.Namespace, peer) -> Found:
    """Acting and env steps: raysim's shard, the peer's rollout phase and, where installed, the peer's agent on
    EnvPool's env (``envpool``), in alternating rounds (``alternate``)."""
    from raysim.envs.registry import materialize
    from raysim.rollout import EnvShard

    rows, steps = config.env.num_envs * config.shards.count, round_steps(config, args)
    shard = EnvShard(
        config.env.id,
        rows,
        seed=config.seed,
        model=config.model,
        env_kwargs=materialize(config.env.id, config.env.kwargs),
        frame_stack=config.env.frame_stack,
    )
    weights = {"version": 1, "actor": shard.actor.state_dict()}

    def raysim_round() -> int:
        torch.set_num_threads(1)  # the shard's own setting (EnvShard), in its process
        return shard.rollout(weights, steps).mask.numel()

    collectors, collections = {"raysim": raysim_round}, []
    try:
        if peer is not None:
            collections.append(peer.Collection(args.seed, args.peer_threads, peer_env_id(args, peer), num_steps=steps))
            collectors["peer"] = collections[-1].collect
        if peer is not None and envpool_installed():
            pool = peer.Collection(args.seed, args.peer_threads, peer.ENVPOOL_ID, num_steps=steps, envpool=True)
            collections.append(pool)
            collectors["envpool"] = pool.collect
        return alternate(collectors, args)
    finally:
        for collection in collections:
            collection.close()


def env_alone(config, args: argparse.Namespace, peer) -> Found:
    """The envs alone, random actions (a seeded stream per side): raysim's env, the peer's wrapped envs and
    EnvPool's, ``round_steps`` steps of every row per round, in alternating rounds (``alternate``)."""
    import numpy as np

    steps = round_steps(config, args)
    env = raysim_env(config)
    env.reset(config.seed)
    space = env.action_space
    space.seed(args.seed)

    def raysim_round() -> int:
        for _ in range(steps):
            env.step(torch.as_tensor(np.stack([space.sample() for _ in range(env.num_envs)])))
        return steps * env.num_envs

    steppers, vectors = {"raysim": raysim_round}, []
    try:
        if peer is not None:
            vectors.append(("peer", peer.make_envs(8, peer_env_id(args, peer)), args.seed))
        if peer is not None and envpool_installed():
            vectors.append(("envpool", peer.make_envpool(8, args.seed), None))  # seeded at make: EnvPool's way
        for name, envs, reset_seed in vectors:
            steppers[name] = vector_round(envs, steps, args.seed, reset_seed)
        return alternate(steppers, args)
    finally:
        env.close()
        for _, envs, _ in vectors:
            envs.close()


def vector_round(envs, steps: int, seed: int, reset_seed: int | None):
    """A Gymnasium-style vector env's round (the peer's, EnvPool's), the env reset now: each call steps every
    row ``steps`` times with random actions, sampled row by row as raysim's are, and returns the env steps."""
    import numpy as np

    envs.reset() if reset_seed is None else envs.reset(seed=reset_seed)
    space = envs.single_action_space
    space.seed(seed)

    def round_() -> int:
        for _ in range(steps):
            envs.step(np.stack([space.sample() for _ in range(envs.num_envs)]))
        return steps * envs.num_envs

    return round_


def peer_env_id(args: argparse.Namespace, peer) -> str:
    return args.peer_env_id or peer.ENV_ID


def train_raysim(config) -> dict:
    """One raysim run through Ray actors: env steps, training seconds, the finished games' returns."""
    import raysim
    from raysim.bench.mujoco import last_episodes_return
    from raysim.records import read_metrics
    from raysim.storage import open_storage

    shutil.rmtree(config.run_dir, ignore_errors=True)
    summary = raysim.Trainer(config).train()
    rows = read_metrics(open_storage(str(config.run_dir)))
    curve = [(int(r["env_steps"]), r["episode_return"], int(r["episodes"])) for r in rows if r.get("episodes")]
    return {
        "env_steps": summary.env_steps,
        "train_seconds": summary.wall_time,
        "games": sum(episodes for _, _, episodes in curve),
        "training_return": last_episodes_return(curve, LAST_GAMES),
    }


def train_peer(args: argparse.Namespace, peer) -> dict:
    """One run of the CleanRL-style peer: env steps, training seconds (collection and update), games."""
    result = peer.train(args.seed, args.steps, args.peer_threads, args.peer_device, peer_env_id(args, peer))
    scores = [score for _, score, _ in result["games"]]
    return {
        "env_steps": result["env_steps"],
        "train_seconds": result["train_seconds"],
        "collect_seconds": result["collect_seconds"],
        "update_seconds": result["update_seconds"],
        "games": len(scores),
        "training_return": statistics.fmean(scores[-LAST_GAMES:]) if scores else None,
    }


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"


def medians(found: Found, key: str) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in found[key].items()}


def table(collection: Found, trained: dict[str, dict], threads: dict[str, str], alone: Found) -> str:
    """The Markdown table: one column per side, the raysim / peer ratio in the last; EnvPool's rows at the end
    (its env with the peer's agent in the peer's column, the ratio raysim / EnvPool)."""
    median, cores, env_median = medians(collection, "rates"), medians(collection, "cores"), medians(alone, "rates")
    per_s = {name: r["env_steps"] / r["train_seconds"] for name, r in trained.items() if r["train_seconds"] > 0}
    ours, theirs = trained.get("raysim", {}), trained.get("peer", {})
    split = (
        f"{theirs['collect_seconds']:,.1f} / {theirs['update_seconds']:,.1f}" if "collect_seconds" in theirs else "-"
    )
    body = [
        ("collection alone, env steps/s (median)", median.get("raysim"), median.get("peer"), 0, True),
        ("collection alone, cores used (CPU / wall time)", cores.get("raysim"), cores.get("peer"), 2, False),
        ("env alone (random actions), env steps/s (median)", env_median.get("raysim"), env_median.get("peer"), 0, True),
        ("training, env steps/s", per_s.get("raysim"), per_s.get("peer"), 0, True),
        ("training seconds", ours.get("train_seconds"), theirs.get("train_seconds"), 1, False),
        ("env steps trained", ours.get("env_steps"), theirs.get("env_steps"), 0, False),
        ("games finished", ours.get("games"), theirs.get("games"), 0, False),
        (f"training return: raw game score, last {LAST_GAMES} games", ours.get("training_return"),
         theirs.get("training_return"), 2, False),
    ]  # fmt: skip
    lines = ["| | raysim | CleanRL-style peer | raysim / peer |", "|---|---|---|---|"]
    for name, a, b, digits, ratio in body:
        lines.append(f"| {name} | {_number(a, digits)} | {_number(b, digits)} | {_ratio(a, b) if ratio else ''} |")
    lines.append(f"| peer's collection / update seconds | (overlapped) | {split} | |")
    lines.append(f"| torch threads | {threads.get('raysim', '-')} | {threads.get('peer', '-')} | |")
    return "\n".join(lines + envpool_rows(median, cores, env_median, threads))


def envpool_rows(median: dict, cores: dict, env_median: dict, threads: dict[str, str]) -> list[str]:
    """EnvPool's rows where it was measured; one line saying it is not installed where the peer was but it was not."""
    if "envpool" not in median:
        missing = f"| {ENVPOOL} (CleanRL's ppo_atari_envpool.py env) | | not installed (pip install envpool) | |"
        return [missing] if "peer" in median else []
    rows = [
        (f"{ENVPOOL} collection alone (CleanRL's ppo_atari_envpool.py env, the peer's agent), env steps/s (median)",
         median, 0, True),
        (f"{ENVPOOL} collection alone, cores used (CPU / wall time)", cores, 2, False),
        (f"{ENVPOOL} env alone (random actions), env steps/s (median)", env_median, 0, True),
    ]  # fmt: skip
    lines = []
    for name, values, digits, ratio in rows:
        a, b = values.get("raysim"), values.get("envpool")
        lines.append(f"| {name} | {_number(a, digits)} | {_number(b, digits)} | {_ratio(a, b) if ratio else ''} |")
    return [*lines, f"| {ENVPOOL} threads | | {threads['envpool']} | |"]


def header(config, args: argparse.Namespace, peer) -> str:
    import gymnasium

    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
    rows = config.env.num_envs * config.shards.count
    return "\n".join(
        [
            f"# Atari PPO: raysim `{config.name}` ({config.env.id}) against a CleanRL-style peer "
            f"({peer_env(args, peer)})",
            "",
            f"Budget {args.steps:,} env steps each, seed {args.seed}; raysim: {config.shards.count} shard(s) x "
            f"{config.env.num_envs} envs x {config.algo.num_steps} steps; peer: 8 envs x 128 steps. Collection alone: "
            f"{rows} rows (peer and EnvPool: 8) x {round_steps(config, args)} steps a round, {args.warmups} warm-up "
            f"and {args.rounds} measured rounds alternating; then the envs alone, random actions, likewise. "
            f"A random policy scores about {RANDOM_SCORE} per Breakout game.",
            "",
            f"torch {torch.__version__}, gymnasium {gymnasium.__version__}; Python {platform.python_version()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs; load average at start {load}",
            "",
            "",
        ]
    )


def peer_env(args: argparse.Namespace, peer) -> str:
    """The peer's env id and its sticky actions, as the table says them."""
    if peer is None:
        return "skipped"
    env_id = peer_env_id(args, peer)
    sticky = peer.sticky_actions(env_id)
    return f"{env_id}, sticky actions {sticky:g}" if sticky else f"{env_id}, no sticky actions"


def run(config, args: argparse.Namespace, peer) -> tuple[Found, dict, dict, Found]:
    """Collection alone, the envs alone, then both trainings (the peer first); the measurements and the threads."""
    threads = {"peer": f"{args.peer_threads} ({args.peer_device})"} if peer else {}
    if peer is not None:
        threads["envpool"] = (
            f"torch {args.peer_threads}, EnvPool's pool num_threads={peer.ENVPOOL_THREADS} (thread_affinity_offset=-1)"
        )
    started = start_ray(config) if config.backend == "ray" else False
    torch_threads = torch.get_num_threads()
    try:
        collection = collection_alone(config, args, peer)
        print(f"[collection alone: {json.dumps(collection)}]", file=sys.stderr, flush=True)
        alone = env_alone(config, args, peer)
        print(f"[env alone: {json.dumps(alone)}]", file=sys.stderr, flush=True)
        trained = {}
        if not args.no_training:
            if peer is not None:
                trained["peer"] = train_peer(args, peer)
                print(f"[peer: {json.dumps(trained['peer'])}]", file=sys.stderr, flush=True)
            torch.set_num_threads(torch_threads)
            trained["raysim"] = train_raysim(config)
            print(f"[raysim: {json.dumps(trained['raysim'])}]", file=sys.stderr, flush=True)
        threads["raysim"] = raysim_threads(config)
    finally:
        torch.set_num_threads(torch_threads)
        if started:
            sys.modules["ray"].shutdown()
    return collection, trained, threads, alone


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from raysim.composition import ConfigError

    if importlib.util.find_spec("ale_py") is None:
        print('raysim bench atari: ale-py is not installed (pip install -e ".[atari]")', file=sys.stderr)
        return 2
    try:
        config = load(args)
    except ConfigError as error:
        print(f"raysim bench atari: {error}", file=sys.stderr)
        return 2
    peer = peer_module("cleanrl_ppo_atari")
    args.out.mkdir(parents=True, exist_ok=True)
    text = header(config, args, peer) + table(*run(config, args, peer))
    if peer is None:
        text += f"\n\nSkipped the peer: {MISSING}"
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0
