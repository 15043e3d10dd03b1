"""Time-to-solve benchmark: PPO on CartPole until the first evaluation that passes, raysim and peers.

For each seed, every peer trains until an evaluation passes: 100 deterministic episodes, mean
return >= 475, evaluated every 10k env steps (the evaluation time is not counted). Reported per
seed: env steps and training seconds at that evaluation; for raysim also the Ray start-up and
actor creation, and the end-to-end time (start-up + training, evaluation excluded).

- ``raysim``: ``raysim.Trainer`` with the packaged ``cartpole_ppo`` config through Ray actors
  (shards, evaluation shard and learner), ``eval.every_steps=10000``, ``eval.stop_return=475``;
  a new embedded Ray per seed;
- ``CleanRL-style``: ``benchmarks/cleanrl_ppo.py`` (CleanRL ppo.py defaults), in this process;
- ``SB3``: Stable-Baselines3 PPO with the rl-zoo CartPole-v1 settings, when installed.

The peers live in the source tree (``benchmarks/solve_peers.py``): from an installed wheel only the
raysim rows run. ``raysim bench solve`` or ``python benchmarks/solve.py`` (``--seeds``, ``--peers``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time

from raysim.bench.peers import MISSING, peer_module

TARGET, EVAL_EVERY, EPISODES = 475.0, 10_000, 100
PEERS = ("raysim", "cleanrl", "sb3")


def solve_raysim(seed: int, overrides: list[str]) -> dict:
    """One raysim run through Ray actors, stopped at the first evaluation that passes."""
    import raysim

    with tempfile.TemporaryDirectory() as tmp:
        config = raysim.load_config(
            None,
            overrides=[
                f"seed={seed}",
                f"eval.every_steps={EVAL_EVERY}",
                f"eval.stop_return={TARGET}",
                f"eval.episodes={EPISODES}",
                "train.log_every=1000000",
                f"run_dir={tmp}/run",
                *overrides,
            ],
        )
        start = time.perf_counter()
        summary = raysim.Trainer(config, sinks=[]).train()
        total = time.perf_counter() - start
    mean = summary.evaluation.mean_return if summary.evaluation else None
    return {
        "solved": mean is not None and mean >= TARGET,
        "env_steps": summary.env_steps,
        "train_seconds": summary.wall_time,
        "startup_seconds": summary.startup_time,
        "end_to_end": summary.startup_time + summary.wall_time,
        "wall_clock": total,
        "eval_return": mean,
    }


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raysim bench solve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument(
        "--override", action="append", default=[], help="raysim config override (key=value), repeatable"
    )
    args = parser.parse_args(argv)
    runners = {"raysim": lambda s: solve_raysim(s, args.override)}
    skipped = {}
    peers = peer_module("solve_peers")
    for name in ("cleanrl", "sb3"):
        if peers is None:
            skipped[name] = MISSING
        else:
            runners[name] = getattr(peers, f"solve_{name}")
    if "sb3" in args.peers and importlib.util.find_spec("stable_baselines3") is None:
        skipped["sb3"] = "stable-baselines3 is not installed (pip install stable-baselines3)"
    results: dict[str, list[dict]] = {}
    for peer in args.peers:
        if peer in skipped or peer not in runners:
            continue
        for seed in args.seeds:
            result = {"seed": seed, **runners[peer](seed)}
            results.setdefault(peer, []).append(result)
            print(f"[{peer} seed {seed}: {result}]", file=sys.stderr, flush=True)
    print("# Time to solve CartPole (PPO)\n")
    print(
        f"First evaluation with mean return >= {TARGET:g} over {EPISODES} deterministic episodes, evaluated every "
        f"{EVAL_EVERY:,} env steps; training seconds exclude evaluation; torch threads 1 (raysim: per actor).\n"
    )
    print("| peer | seed | solved | env steps | training s | Ray start-up + actors s | end to end s |")
    print("|---|---|---|---|---|---|---|")
    for peer, rows in results.items():
        for r in rows:
            print(
                f"| {peer} | {r['seed']} | {'yes' if r['solved'] else 'NO'} | {_fmt(r['env_steps'])} | "
                f"{_fmt(r['train_seconds'])} | {_fmt(r.get('startup_seconds'))} | {_fmt(r.get('end_to_end'))} |"
            )
    print("\n## Medians\n")
    print("| peer | solved | median env steps | median training s | median start-up s | median end to end s |")
    print("|---|---|---|---|---|---|")
    for peer, rows in results.items():

        def med(key: str, rows: list[dict] = rows) -> float | None:
            values = [r.get(key) for r in rows]
            return statistics.median(values) if all(v is not None for v in values) else None

        print(
            f"| {peer} | {sum(r['solved'] for r in rows)}/{len(rows)} | {_fmt(med('env_steps'), 0)} | "
            f"{_fmt(med('train_seconds'))} | {_fmt(med('startup_seconds'))} | {_fmt(med('end_to_end'))} |"
        )
    for peer, why in skipped.items():
        print(f"\nSkipped {peer}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
