"""``python benchmarks/gpu_check.py``: what a GPU buys a policy server and a learner for a large CNN policy.

The policy: the Nature CNN (``cnn_features`` 512) on Atari-sized 4 x 84 x 84 uint8 frames and an MLP [1024, 1024]
(4 discrete actions; the actor and critic each read the frames through their own CNN). Rows, medians and p90:

- server: ``PolicyServer.serve`` on ``--device`` (cuda) of one step of 8 env workers x 16 rows (8 requests, one
  batch: the frames to the device, forward, sampling, replies back on the host);
- server on CPU: the same 8 requests on a CPU ``PolicyServer`` (one torch thread);
- collocated: one worker's 16 rows through the same actor on its own CPU (``Actor.sample`` under ``inference``, one
  thread), what each of the 8 workers pays per step, side by side, without a server;
- learner: one PPO update (``raysim.learner.Learner``, 4 epochs x 4 minibatches) of a synthetic chunk of 32 steps x
  16 rows on ``--device`` against the same on the CPU (all this host's torch threads, ``--threads``: on a busy host
  fewer; 2 threads on a loaded 2-core machine ran 30x slower than 1).

The rounds alternate the rows, warm-ups dropped. Without a visible CUDA device it stops with one line; ``--device
cpu`` runs the device rows on the CPU (checks this script anywhere) and ``--quick`` shrinks every count. A few
minutes on a GPU host, most of it the CPU learner.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import torch

from raysim.algos.ppo import PPOConfig
from raysim.bench.images import ATARI_SHAPE, atari_chunk
from raysim.learner.learner import Learner
from raysim.models import Actor, ActorCritic, ModelConfig
from raysim.rollout.inference import inference
from raysim.rollout.server import ActRequest, PolicyServer

MODEL = ModelConfig(
    actor_inputs=["policy"], critic_inputs=["policy"], cnn="nature", cnn_features=512, hidden_sizes=[1024, 1024]
)
SPACES = {"policy": gym.spaces.Box(0, 255, ATARI_SHAPE, dtype="uint8")}
ACTIONS = gym.spaces.Discrete(4)
WORKERS, ROWS, CHUNK_STEPS = 8, 16, 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="where the server and the learner rows run (cuda, cpu)")
    parser.add_argument("--steps", type=int, default=200, help="inference steps of each row")
    parser.add_argument("--updates", type=int, default=5, help="learner updates of each device")
    parser.add_argument("--threads", type=int, help="torch threads of the CPU learner (default: torch's, all cores)")
    parser.add_argument("--quick", action="store_true", help="a check of the script: few steps, 8-step chunks")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.updates = 5, 1
    return args


def requests(actor: Actor, generator: torch.Generator) -> list[ActRequest]:
    """One step of ``WORKERS`` workers of ``ROWS`` rows: random frames and the rows' draws."""
    frames = [
        torch.randint(0, 256, (ROWS, *ATARI_SHAPE), dtype=torch.uint8, generator=generator) for _ in range(WORKERS)
    ]
    return [ActRequest(("check", 1), {"policy": f}, actor.draws(ROWS, generator)) for f in frames]


def inference_rows(device: str, steps: int) -> dict[str, list[float]]:
    """ms per step of the server on ``device``, the server on the CPU and one collocated worker."""
    generator = torch.Generator().manual_seed(0)
    actor = Actor(SPACES, ACTIONS, MODEL)
    weights = {"version": 1, "timeline": "check", "actor": actor.state_dict()}
    servers = {f"server on {device}, {WORKERS} x {ROWS} rows": PolicyServer(SPACES, ACTIONS, MODEL, device=device)}
    servers[f"server on cpu, {WORKERS} x {ROWS} rows"] = PolicyServer(SPACES, ACTIONS, MODEL, device="cpu")
    for server in servers.values():
        server.load(weights)
    torch.set_num_threads(1)
    step = requests(actor, generator)
    ways: dict[str, Callable[[], object]] = {name: lambda s=s: s.serve(step) for name, s in servers.items()}

    def collocated() -> None:
        with inference(actor):
            actor.sample(step[0].obs, generator)

    ways[f"collocated on cpu, {ROWS} rows (each worker, in parallel)"] = collocated
    return alternate(ways, steps, warmups=10)


def learner_rows(device: str, updates: int, quick: bool, threads: int) -> dict[str, list[float]]:
    """ms per PPO update of the synthetic chunk on ``device`` and on the CPU."""
    chunk = atari_chunk(8 if quick else CHUNK_STEPS, ROWS, seed=0)
    algo = PPOConfig(update_epochs=1 if quick else 4, num_minibatches=4)
    learners = {
        d: Learner(SPACES, ACTIONS, MODEL, algo, horizon=10**9, device=d) for d in dict.fromkeys([device, "cpu"])
    }
    torch.set_num_threads(threads)

    def update(learner: Learner) -> None:
        learner.update(chunk, log=False)
        if learner.device.type == "cuda":
            torch.cuda.synchronize()

    steps = chunk.actions.numel()
    ways = {f"learner on {d}, PPO update of {steps} samples": lambda x=x: update(x) for d, x in learners.items()}
    return alternate(ways, updates, warmups=1)


def alternate(ways: dict[str, Callable[[], object]], steps: int, warmups: int) -> dict[str, list[float]]:
    """ms of each way's calls, the ways taking turns call by call; the first ``warmups`` turns dropped."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for turn in range(warmups + steps):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            if turn >= warmups:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def report(times: dict[str, list[float]], device: str, threads: int) -> str:
    actor_bytes = sum(p.nbytes for p in Actor(SPACES, ACTIONS, MODEL).parameters())
    model_bytes = sum(p.nbytes for p in ActorCritic(SPACES, ACTIONS, MODEL).parameters())
    where = torch.cuda.get_device_name() if device.startswith("cuda") else "the CPU (--device cpu)"
    step_bytes = WORKERS * ROWS * torch.Size(ATARI_SHAPE).numel()
    lines = [
        f"Device rows on {where}; torch {torch.__version__}, {os.cpu_count()} CPUs, CPU learner on {threads} threads, "
        f"load average {os.getloadavg()[0]:.2f}. Nature CNN + MLP [1024, 1024] on {ATARI_SHAPE} uint8: actor "
        f"{actor_bytes / 2**20:.1f} MiB, actor + critic {model_bytes / 2**20:.1f} MiB; a server step's frames "
        f"{step_bytes / 2**20:.2f} MiB.",
        "",
        "| row | median ms | p90 ms |",
        "|---|---|---|",
    ]
    for name, samples in times.items():
        ordered = sorted(samples)
        lines.append(f"| {name} | {statistics.median(samples):.2f} | {ordered[round(0.9 * (len(ordered) - 1))]:.2f} |")
    return "\n".join(lines)


def main() -> int:
    args = parse()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); try --device cpu")
    threads = args.threads or torch.get_num_threads()  # read before PolicyServer sets one thread for the process
    torch.manual_seed(0)
    times = inference_rows(args.device, args.steps)
    times.update(learner_rows(args.device, args.updates, args.quick, threads))
    print(report(times, args.device, threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
