"""Scale benchmark: training env steps/s against the number of shards, lockstep and overlapped, with and
without stragglers, against the ideal of S shards each collecting as fast as one shard alone.

The env is ``SleepingCartPole``: each batched step sleeps (``--step-ms``, 40 ms by default), as a remote
simulator or a heavy physics engine would make a shard wait, so that shards plus learner stay well under
this machine's cores and what is measured is raysim's loop: how much of the time every simulator is busy.
Chunks of 64 rows x 32 steps, one update epoch of one minibatch, ``shards.num_cpus=0.05``, one embedded
Ray for all runs. Stragglers: 10% of chunks, on random shards, take 5x longer.

Per run: env steps/s over the iterations after the first two (warm-up), the ideal (S x one shard
collecting alone, measured here first; with stragglers, divided by their expected slow-down 1.4),
parallel efficiency (their ratio), the learner's idle fraction (time waiting for chunks / (that +
update time)), the mean policy lag and the cores busy on the whole machine (every process counted).
Modes: ``lockstep`` (``algo.max_policy_lag=0``), ``overlapped`` (lag 1) and, with stragglers,
``overlapped+first`` (lag 1, ``shards.wait_fraction=0.75``: each batch is the first 75% of chunks to arrive).

``raysim bench scale`` (``--shards 1,2,4,8,16,32``, ``--straggle-at 16``, ``--iterations``, ``--plot``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

ROWS, STEPS = 64, 32
SLOW = {"slow_prob": 0.1, "slow_factor": 5.0}
MODES = {
    "lockstep": ["algo.max_policy_lag=0"],
    "overlapped": ["algo.max_policy_lag=1"],
    "overlapped+first": ["algo.max_policy_lag=1", "shards.wait_fraction=0.75"],
}


class Recorder:
    """A metrics sink that keeps every record."""

    def __init__(self):
        self.records: list[dict] = []

    def write(self, record: dict) -> None:
        self.records.append(dict(record))

    def close(self) -> None:
        pass


def busy_cores_seconds() -> float:
    """CPU seconds this machine spent busy so far, all processes (Linux ``/proc/stat``; 0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def env_kwargs(step_ms: float, stragglers: bool) -> dict:
    return {"step_seconds": step_ms / 1000, "chunk_steps": STEPS, **(SLOW if stragglers else {})}


def one_shard_alone(step_ms: float, chunks: int) -> float:
    """Env steps/s of one shard actor collecting chunk after chunk with fixed weights (no learner)."""
    import ray

    from raysim.actors import RayBackend
    from raysim.algos.ppo import PPOConfig
    from raysim.learner import Learner
    from raysim.models import ModelConfig
    from raysim.rollout import EnvShard, FixedSteps

    backend = RayBackend()
    shard = backend.create(
        EnvShard, "raysim.bench.sleeping:SleepingCartPole", ROWS, seed=7, env_kwargs=env_kwargs(step_ms, False),
        options={"num_cpus": 0.05},
    )  # fmt: skip
    spaces, action_space, _ = backend.get(shard.call(EnvShard.spaces))
    weights = ray.put(Learner(spaces, action_space, ModelConfig(), PPOConfig(), horizon=1).get_weights())
    backend.get(shard.call(EnvShard.rollout, weights, FixedSteps(STEPS)))  # warm-up
    start = time.perf_counter()
    backend.get([shard.call(EnvShard.rollout, weights, FixedSteps(STEPS)) for _ in range(chunks)])
    seconds = time.perf_counter() - start
    backend.kill(shard)
    return chunks * ROWS * STEPS / seconds


def train_run(shards: int, mode: str, step_ms: float, stragglers: bool, iterations: int) -> dict:
    """One training run; its steady-state figures (iterations after the first two)."""
    import raysim

    recorder = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        config = raysim.load_config(
            None,
            overrides=[
                "backend=ray",
                "env.id=raysim.bench.sleeping:SleepingCartPole",
                f"env.num_envs={ROWS}",
                f"env.kwargs={env_kwargs(step_ms, stragglers)}",
                f"algo.num_steps={STEPS}",
                "algo.update_epochs=1",
                "algo.num_minibatches=1",
                f"shards.count={shards}",
                "shards.num_cpus=0.05",
                f"train.total_steps={shards * ROWS * STEPS * iterations}",
                "train.log_every=1",
                "eval.episodes=0",
                "checkpoint.every=0",
                "checkpoint.every_seconds=0",
                f"run_dir={tmp}/run",
                *MODES[mode],
            ],
        )
        busy0, wall0 = busy_cores_seconds(), time.perf_counter()
        summary = raysim.Trainer(config, sinks=[recorder]).train()
        cores = (busy_cores_seconds() - busy0) / (time.perf_counter() - wall0)
    rows = recorder.records
    warm, last = rows[1], rows[-1]
    steps_per_s = (last["env_steps"] - warm["env_steps"]) / (last["time"] - warm["time"])
    collect = sum(r["time_collect"] for r in rows[2:])
    update = sum(r["time_update"] for r in rows[2:])
    return {
        "steps_per_s": steps_per_s,
        "idle": collect / max(collect + update, 1e-9),
        "lag": statistics.fmean(r["policy_lag"] for r in rows[2:]),
        "stale": sum(r.get("stale_steps", 0.0) for r in rows),
        "iterations": summary.iterations,
        "cores": cores,
    }


def table(results: list[dict]) -> str:
    head = (
        "| shards S | mode | stragglers | env steps/s | ideal | parallel efficiency | learner idle | policy lag | CPU |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['shards']} | {r['mode']} | {'yes' if r['stragglers'] else 'no'} | {r['steps_per_s']:,.0f} | "
            f"{r['ideal']:,.0f} | {r['steps_per_s'] / r['ideal']:.1%} | {r['idle']:.0%} | {r['lag']:.2f} | "
            f"{r['cores']:.2f} |"
        )
    return "\n".join(lines)


def ratios(results: list[dict]) -> list[str]:
    """The side-by-side ratios the targets are stated in."""
    by = {(r["shards"], r["mode"], r["stragglers"]): r["steps_per_s"] for r in results}
    lines = []
    for (shards, mode, slow), rate in sorted(by.items()):
        base = by.get((shards, "lockstep", slow))
        if mode != "lockstep" and base:
            lines.append(f"S={shards}{' stragglers' if slow else ''}: {mode} / lockstep = {rate / base:.2f}x")
    return lines


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    plain = [r for r in results if not r["stragglers"]]
    shards = sorted({r["shards"] for r in plain})
    ax.plot(shards, [next(r["ideal"] for r in plain if r["shards"] == s) for s in shards], "k--", label="ideal")
    for mode in ("lockstep", "overlapped"):
        points = sorted((r["shards"], r["steps_per_s"]) for r in plain if r["mode"] == mode)
        ax.plot(*zip(*points, strict=True), "o-", label=mode)
    ax.set(xscale="log", yscale="log", xlabel="shards", ylabel="env steps/s", title="raysim scale (sleeping env)")
    ax.set_xticks(shards, [str(s) for s in shards])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raysim bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default="1,2,4,8,16,32", help="shard counts, comma-separated")
    parser.add_argument("--straggle-at", default="16", help="shard counts also run with stragglers ('' none)")
    parser.add_argument("--step-ms", type=float, default=40.0, help="sleep per batched env step, ms")
    parser.add_argument("--iterations", type=int, default=10, help="iterations per run (the first two are warm-up)")
    parser.add_argument("--plot", default=None, help="write a PNG of env steps/s against shards here")
    args = parser.parse_args(argv)
    counts = [int(s) for s in args.shards.split(",") if s]
    straggle = {int(s) for s in args.straggle_at.split(",") if s}
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=max(4, int(0.05 * max(counts)) + 3), include_dashboard=False, log_to_driver=False)
    try:
        plain = one_shard_alone(args.step_ms, 12)
        alone = {False: plain, True: plain / (1 + SLOW["slow_prob"] * (SLOW["slow_factor"] - 1))}
        print(f"one shard alone: {plain:,.0f} env steps/s; with stragglers (expected): {alone[True]:,.0f}", flush=True)
        results = []
        for shards in counts:
            runs = [("lockstep", False), ("overlapped", False)]
            if shards in straggle:
                runs += [("lockstep", True), ("overlapped", True), ("overlapped+first", True)]
            for mode, slow in runs:
                started = time.perf_counter()
                run = train_run(shards, mode, args.step_ms, slow, args.iterations)
                run.update(shards=shards, mode=mode, stragglers=slow, ideal=shards * alone[slow])
                results.append(run)
                print(
                    f"S={shards:3d} {mode:17s} stragglers={'yes' if slow else 'no '}: {run['steps_per_s']:9,.0f} "
                    f"env steps/s ({run['steps_per_s'] / run['ideal']:.1%} of ideal), learner idle "
                    f"{run['idle']:.0%}, lag {run['lag']:.2f}, {run['cores']:.2f} cores busy, "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
    finally:
        ray.shutdown()
    print()
    print(table(results))
    print()
    print("\n".join(ratios(results)))
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    return 0
