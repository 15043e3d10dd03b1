"""The image rows of the collection benchmark: a chunk's bytes and its way from a shard to a learner.

Two payloads: a real chunk of ``raysim/ReachCamera`` (uint8 camera images, the joint and critic
vectors) and a synthetic Atari-sized chunk (4 x 84 x 84 uint8 frames). Each is held by one Ray actor
(the shard side), returned by it and read by another (the learner side) as a ``RolloutChunk``;
beside it, a bare NumPy array of the same bytes through the same two actors, the two chained calls
without data, and this machine's memcpy of the same bytes (the physical limit), all alternating
within each round, medians. Peak resident memory (``ru_maxrss``) of both actors and the driver
follows (object-store pages a process touched count in its RSS).
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

CAMERA = "camera Reach"
ATARI = "Atari-sized 4x84x84"
ATARI_SHAPE = (4, 84, 84)
WAYS = ("memcpy", "calls, no data", "NumPy array", "RolloutChunk")


def peak_rss_mib() -> float:
    """This process's peak resident memory (``ru_maxrss``), MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def chunk_bytes(chunk) -> tuple[int, int]:
    """The bytes of every tensor of ``chunk`` and of its uint8 observation groups."""
    total = images = 0
    for value in vars(chunk).values():
        tensors = value.values() if isinstance(value, dict) else [value]
        for tensor in (t for t in tensors if torch.is_tensor(t)):
            total += tensor.nbytes
    for group in (chunk.obs, chunk.final_obs):
        images += sum(t.nbytes for t in group.values() if t.dtype == torch.uint8)
    return total, images


def atari_chunk(steps: int, envs: int, seed: int):
    """A synthetic chunk of ``steps`` x ``envs`` with 4 x 84 x 84 uint8 observations (random frames)."""
    from raysim.rollout.chunk import RolloutChunk

    generator = torch.Generator().manual_seed(seed)
    empty = torch.zeros(0, dtype=torch.int64)
    return RolloutChunk(
        obs={"policy": torch.randint(0, 256, (steps + 1, envs, *ATARI_SHAPE), dtype=torch.uint8, generator=generator)},
        actions=torch.randint(0, 4, (steps, envs), generator=generator),
        logp=torch.randn(steps, envs, generator=generator),
        reward=torch.randn(steps, envs, generator=generator),
        terminated=torch.zeros(steps, envs, dtype=torch.bool),
        truncated=torch.zeros(steps, envs, dtype=torch.bool),
        mask=torch.ones(steps, envs, dtype=torch.bool),
        final_obs={"policy": torch.zeros(0, *ATARI_SHAPE, dtype=torch.uint8)},
        final_t=empty,
        final_row=empty.clone(),
        episodes={},
        policy_version=0,
    )


def camera_chunk(steps: int, envs: int, seed: int):
    """A real chunk of ``raysim/ReachCamera`` (actor reading the camera and the joints), collected here."""
    from raysim.rollout.shard import EnvShard

    shard = EnvShard("raysim/ReachCamera", envs, seed=seed, model={"actor_inputs": ["camera", "joints"]})
    return shard.rollout({"version": 1, "actor": shard.actor.state_dict()}, steps)


class ShardSide:
    """Holds a payload's chunk and a bare array of its bytes; returns either (each call: a new object)."""

    def __init__(self, payload: str, steps: int, envs: int, seed: int):
        torch.set_num_threads(1)
        self.chunk = (camera_chunk if payload == CAMERA else atari_chunk)(steps, envs, seed)
        self.array = np.random.default_rng(seed).integers(0, 256, chunk_bytes(self.chunk)[0], dtype=np.uint8)

    def sizes(self) -> tuple[int, int]:
        return chunk_bytes(self.chunk)

    def send(self, way: str) -> Any:
        return self.chunk if way == "RolloutChunk" else self.array if way == "NumPy array" else 0

    def peak_rss_mib(self) -> float:
        return peak_rss_mib()


class LearnerSide:
    """Reads what the shard side returned (Ray resolves the reference before the call): its kind, checked."""

    def read(self, value: Any, way: str) -> str:
        from raysim.rollout.chunk import RolloutChunk

        kind = {"RolloutChunk": RolloutChunk, "NumPy array": np.ndarray}.get(way, int)
        if not isinstance(value, kind):
            raise TypeError(f"the learner side read a {type(value).__name__}, not a {kind.__name__}")
        return way

    def peak_rss_mib(self) -> float:
        return peak_rss_mib()


def measure_images(args, payloads: tuple[str, ...] = (CAMERA, ATARI)) -> dict[str, Any]:
    """Every payload's bytes and ms of each way (``WAYS``), rounds alternating; the peak RSS of all."""
    found: dict[str, Any] = {"sizes": {}, "times": {}, "rss": {}}
    for payload in payloads:
        found["sizes"][payload], found["times"][payload], found["rss"][payload] = _measure_payload(args, payload)
    found["rss"]["driver"] = peak_rss_mib()
    return found


def _measure_payload(args, payload: str) -> tuple[tuple[int, int], dict[str, list[float]], list[float]]:
    """One payload between two new actors: its sizes, each way's times, the actors' peak RSS."""
    import ray

    remote = ray.remote(num_cpus=0)
    shard = remote(ShardSide).remote(payload, args.steps, args.image_envs, args.seed)
    learner = remote(LearnerSide).remote()
    try:
        sizes = ray.get(shard.sizes.remote())
        source = np.random.default_rng(args.seed).integers(0, 256, sizes[0], dtype=np.uint8)
        target = np.empty_like(source)
        ways: dict[str, Callable[[], Any]] = {"memcpy": lambda: np.copyto(target, source)}
        for way in WAYS[1:]:
            ways[way] = lambda way=way: ray.get(learner.read.remote(shard.send.remote(way), way))
        times = _alternating(ways, args.warmups, args.samples)
        return sizes, times, ray.get([shard.peak_rss_mib.remote(), learner.peak_rss_mib.remote()])
    finally:
        ray.kill(shard)
        ray.kill(learner)


def _alternating(ways: dict[str, Callable[[], Any]], warmups: int, samples: int) -> dict[str, list[float]]:
    """ms of each way per round, the order rotating every round; the first ``warmups`` rounds discarded.

    Each way runs twice in a row and the second is timed: it finds the object store as a training loop
    does, the block its previous object of this size used free again. Alternated one for one, a chunk
    would find the block of the last (slightly smaller) bare array too small and be written to store
    memory this process has not touched: one page fault per 4 KiB (a 42.6 MiB put measured here:
    10,919 minor faults and 24-29 ms, against 4 faults and 10 ms into reused memory).
    """
    names, times = list(ways), {name: [] for name in ways}
    for rnd in range(warmups + samples):
        gc.collect()
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            ways[name]()
            start = time.perf_counter()
            ways[name]()
            if rnd >= warmups:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def image_report(args, found: dict[str, Any], table: Callable[[list[str], list[list[str]]], str]) -> list[str]:
    """The Markdown of the image rows: bytes, the ways' medians and their ratios, the peak RSS."""
    rows, memory = [], []
    for payload, times in found["times"].items():
        total, images = found["sizes"][payload]
        med = {way: statistics.median(samples) for way, samples in times.items()}
        mib = total / 2**20
        rows.append(
            [
                payload,
                f"{mib:.1f}",
                f"{images / 2**20:.1f} ({4 * images / 2**20:.1f})",
                f"{med['memcpy']:.3g} ({total / med['memcpy'] / 1e6:.1f} GB/s)",
                f"{med['calls, no data']:.2f}",
                f"{med['NumPy array']:.2f}",
                f"{med['RolloutChunk']:.2f}",
                f"{med['NumPy array'] / med['RolloutChunk']:.2f}x",
                f"{med['memcpy'] / med['NumPy array']:.0%} / {med['memcpy'] / med['RolloutChunk']:.0%}",
            ]
        )
        shard_rss, learner_rss = found["rss"][payload]
        memory.append([payload, f"{shard_rss:.0f}", f"{learner_rss:.0f}"])
    header = [
        "payload",
        "chunk MiB",
        "uint8 images MiB (as float32)",
        "memcpy ms",
        "calls, no data ms",
        "NumPy array ms",
        "RolloutChunk ms",
        "chunk speed vs NumPy",
        "memcpy / NumPy, / chunk",
    ]
    return [
        "",
        f"## Images: a chunk of {args.steps} steps x {args.image_envs} rows from a shard actor to a learner actor",
        "",
        "Returned by one Ray actor and read by another through the object store (as a `RolloutChunk`, and as a",
        "bare NumPy array of the same bytes), the two calls without data, and a memcpy of the same bytes in",
        f"this process (the physical limit); median ms of {args.samples} alternating rounds.",
        "",
        table(header, rows),
        "",
        f"Peak RSS MiB (ru_maxrss, object-store pages touched included): driver {found['rss']['driver']:.0f}",
        "",
        table(["payload", "shard-side actor", "learner-side actor"], memory),
    ]
