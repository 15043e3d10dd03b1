"""Object-store use over a run: it stays flat when every iteration's objects are released (nothing spills).

A tiny PPO run on CartPole whose chunk, weights and learner snapshot are each large enough for Ray's
shared-memory object store (over its 100 KiB inline limit: 128 rows x 32 steps, an MLP [256, 256]),
trained on Ray for ``--iterations`` (500); around iteration 10 and the last the bytes the store holds
(Ray's node stats: ``object_store_bytes_used``, as ``ray memory --stats-only`` prints them, the median
of 5 iterations) and what it spilled. Verdict: the bytes at the last iteration within 10% of those at
iteration 10, nothing spilled.

``raysim bench store [--iterations N]``; exit status 1 when the use grew or anything spilled.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

TOLERANCE = 0.10  # the bytes after the last iteration: within this fraction of those after iteration 10
EARLY = 10
WINDOW = 5  # iterations sampled up to each point: their median (objects are released asynchronously)
ROWS, STEPS = 128, 32  # a chunk of ~150 KB: in the shared-memory store, not inlined
OVERRIDES = [
    "backend=ray",
    "env.id=raysim/CartPole",
    "shards.count=1",
    f"env.num_envs={ROWS}",
    f"algo.num_steps={STEPS}",
    "algo.update_epochs=1",
    "algo.num_minibatches=1",
    "model.hidden_sizes=[256,256]",
    "train.log_every=1",
    "train.sinks=[]",
    "checkpoint.every=0",
    "checkpoint.every_seconds=0",
    "eval.episodes=0",
]


def store_stats() -> dict[str, int]:
    """The object store's bytes in use, objects, and bytes spilled so far, summed over the cluster's nodes
    (Ray's ``FormatGlobalMemoryInfo``: the figures ``ray memory --stats-only`` prints, in bytes)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    stats = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats
    return {
        "bytes": int(stats.object_store_bytes_used),
        "objects": int(stats.num_local_objects),
        "spilled": int(stats.spilled_bytes_total),
    }


def measure(iterations: int, settle: float = 1.5) -> dict[int, dict[str, int]]:
    """Train the tiny run on the current Ray (started if needed); the store's stats at iteration ``EARLY`` and
    ``iterations``: each the median bytes and objects of the ``WINDOW`` iterations up to it, each sampled
    ``settle`` seconds after its iteration (Ray frees released objects in batches, once a second by default:
    ``free_objects_period_milliseconds``; sampled at once, the count saws between 4 and 14 objects), the
    spilled bytes of the last. The run goes on one
    iteration more: both are taken mid-run (the last iteration ends with a checkpoint's fetch)."""
    import raysim
    from raysim.coordinator import Trainer

    samples: dict[int, list[dict[str, int]]] = {EARLY: [], iterations: []}
    done = 0

    def reporter(record: dict[str, Any], checkpoint: Any) -> bool:
        nonlocal done
        done += 1
        for point, taken in samples.items():
            if point - WINDOW < done <= point:
                time.sleep(settle)
                taken.append(store_stats())
        return False  # the run goes on

    with tempfile.TemporaryDirectory(prefix="raysim-store-") as run_dir:
        steps = (iterations + 1) * ROWS * STEPS
        config = raysim.load_config(None, [*OVERRIDES, f"train.total_steps={steps}", f"run_dir={run_dir}/run"])
        Trainer(config, reporter=reporter).train()
    return {
        point: {
            "bytes": int(statistics.median(s["bytes"] for s in taken)),
            "objects": int(statistics.median(s["objects"] for s in taken)),
            "spilled": taken[-1]["spilled"],
        }
        for point, taken in samples.items()
    }


def verdict(seen: dict[int, dict[str, int]], iterations: int) -> tuple[bool, str]:
    """Whether the use stayed flat and nothing spilled; a line that says so with the figures."""
    early, late = seen[EARLY], seen[iterations]
    growth = (late["bytes"] - early["bytes"]) / max(early["bytes"], 1)
    flat = abs(growth) <= TOLERANCE and late["spilled"] == 0
    line = (
        f"object store at iteration {EARLY}: {early['bytes']:,} bytes in {early['objects']} objects; at "
        f"{iterations}: {late['bytes']:,} bytes in {late['objects']} objects ({growth:+.1%}); spilled "
        f"{late['spilled']:,} bytes: {'flat' if flat else 'NOT flat'} (limit {TOLERANCE:.0%}, nothing spilled)"
    )
    return flat, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="raysim bench store", description="Object-store bytes over a tiny CartPole run: do they stay flat?"
    )
    parser.add_argument("--iterations", type=int, default=500, help=f"iterations (default 500; > {EARLY})")
    args = parser.parse_args(argv)
    if args.iterations <= EARLY:
        parser.error(f"--iterations must be > {EARLY}")
    start = time.perf_counter()
    flat, line = verdict(measure(args.iterations), args.iterations)
    print(line)
    print(f"[{args.iterations} iterations in {time.perf_counter() - start:.0f} s]", file=sys.stderr)
    return 0 if flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
