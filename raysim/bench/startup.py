"""Start-up benchmark: raysim's time before its first iteration against Ray's own floor, side by side.

Each measurement runs in a new Python process whose imports (torch, ray, raysim) are done before its
clock starts, alternating between the two kinds, ``--repeats`` times each:

- ``Ray floor``: ``ray.init`` exactly as raysim starts its embedded Ray for the config (the same call,
  ``raysim.coordinator.cluster.start_embedded``), then the parallel start of one bare actor, importing
  torch, per training shard and learner rank (with their resource requests), until the shards' answer:
  what any torch-based Ray program with these actors pays;
- ``raysim``: ``Trainer(config)`` (the preflight: env and model built in the driver) and ``train()`` until
  its first iteration starts (``Summary.startup_time``: Ray, the roles, the run directory and its snapshot,
  the sinks), which is when the training shards answered. In both, the learner ranks go on starting into the
  first iteration (it waits for their weights); raysim's evaluation shards are created after the training
  shards answered, as in every run.

The difference is what raysim itself adds. ``raysim bench startup [--config NAME] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time


def measure_floor(config_name: str) -> dict:
    """``ray.init`` as raysim calls it, then the bare actors of the roles a run waits for (seconds)."""
    import ray

    import raysim
    from raysim.coordinator.cluster import needs, start_embedded

    config = raysim.load_config(config_name)

    class Bare:  # by value (defined here): its process imports torch, not raysim
        def __init__(self):
            import torch  # noqa: F401 - what every role of a torch program imports

        def ready(self) -> bool:
            return True

    start = time.perf_counter()
    start_embedded(config)
    began_actors = time.perf_counter()
    actors: dict[str, list] = {}
    for need in needs(config):
        if need.role == "evaluation shards":  # raysim starts them after the training shards answered
            continue
        each = {"num_cpus": need.each.get("CPU", 0), "num_gpus": need.each.get("GPU", 0)}
        custom = {k: v for k, v in need.each.items() if k not in ("CPU", "GPU") and v > 0}
        options = {**each, "resources": custom} if custom else each
        actors[need.role] = [ray.remote(Bare).options(**options).remote() for _ in range(need.count)]
    ray.get([a.ready.remote() for a in actors["shards"]])
    end = time.perf_counter()
    ray.shutdown()
    return {"init": began_actors - start, "actors": end - began_actors, "total": end - start}


def measure_raysim(config_name: str) -> dict:
    """``Trainer(config).train()`` until its first iteration starts (seconds); one iteration is trained."""
    import ray  # noqa: F401 - imported before the clock starts, as in the floor's process

    import raysim

    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["train.total_steps=1", "eval.episodes=1", "checkpoint.every=0", f"run_dir={tmp}/run"]
        config = raysim.load_config(config_name, overrides=overrides)
        start = time.perf_counter()
        trainer = raysim.Trainer(config, address="local", sinks=[])  # an embedded Ray, as the floor's
        preflight = time.perf_counter() - start
        summary = trainer.train()
    return {"preflight": preflight, "train_startup": summary.startup_time, "total": preflight + summary.startup_time}


def run_child(kind: str, config_name: str) -> dict:
    """One measurement in a new process (its imports done before its clock starts)."""
    done = subprocess.run(
        [sys.executable, "-m", "raysim.bench.startup", "--one", kind, "--config", config_name],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {kind} measurement failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def report(config_name: str, floors: list[dict], runs: list[dict]) -> str:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    floor = statistics.median(f["total"] for f in floors)
    ours = statistics.median(r["total"] for r in runs)
    return "\n".join(
        [
            f"# raysim start-up against Ray's floor ({config_name}, {len(floors)} runs each, alternating)",
            "",
            "| what | median s (min-max) |",
            "|---|---|",
            f"| Ray floor: ray.init (as raysim starts it) | {cell([f['init'] for f in floors])} |",
            f"| Ray floor: + bare shard and learner actors (importing torch) | {cell([f['actors'] for f in floors])} |",
            f"| **Ray floor, total** | {cell([f['total'] for f in floors])} |",
            f"| raysim: preflight (env and model in the driver) | {cell([r['preflight'] for r in runs])} |",
            f"| raysim: train() until the first iteration | {cell([r['train_startup'] for r in runs])} |",
            f"| **raysim, total** | {cell([r['total'] for r in runs])} |",
            "",
            f"raysim - floor: {ours - floor:+.2f} s (medians); raysim / floor: {ours / floor:.2f}x",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raysim bench startup", description="raysim's start-up against Ray's floor, in one run."
    )
    parser.add_argument("--config", default="cartpole_ppo", help="config name or YAML file (default cartpole_ppo)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each kind (default 3)")
    parser.add_argument("--one", choices=["floor", "raysim"], help=argparse.SUPPRESS)  # a child process's one
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.one:
        measure = measure_floor if args.one == "floor" else measure_raysim
        print(json.dumps(measure(args.config)), flush=True)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    floors, runs = [], []
    for i in range(args.repeats):
        for kind in ("floor", "raysim") if i % 2 == 0 else ("raysim", "floor"):
            result = run_child(kind, args.config)
            (floors if kind == "floor" else runs).append(result)
            print(f"[{kind} {i + 1}/{args.repeats}: {result['total']:.2f} s]", file=sys.stderr, flush=True)
    print(report(args.config, floors, runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
