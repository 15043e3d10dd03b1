"""Policy serving's costs (``shards.placement: servers``): a step's round trip from an env worker to a policy server,
and the step-time split of an env worker that bounds what pipelining acting and stepping could gain.

Round trip, per step, of one ``ActRequest`` (64 rows; the actor's observation groups and the rows' noise draws):
camera Reach (``reach_camera_ppo``'s keypoint-CNN actor on ``camera`` uint8 [64, 3, 32, 32] and ``joints``) and
CartPole (``cartpole_ppo``'s [64, 64] MLP). Ways, all timed inside one worker actor:

- ``memcpy``: a torch ``copy_`` of the request's observation tensors (the scale of its bytes);
- ``in-process``: ``PolicyServer.act`` in the worker's own process (no Ray);
- ``Ray call``: ``ray.get(server.act.remote(request))`` to a ``BatchingServer`` actor;
- ``Compiled Graph``: an ``InputNode -> act`` graph to a ``PolicyServer`` actor, compiled and executed by the worker
  (a graph runs only in the process that compiled it; shared-memory channels on one node). It is compiled at the
  start of each of its rounds and torn down at the end (its compile time is a row): while it exists its server spins
  on the input channel, a share of a core taken from everything else (a row too).

Every way runs ``--steps`` steps in each round, in an order that rotates every round; the first ``--warmups`` rounds
are dropped; medians and p90 of every remaining step. The replies of the Ray ways are checked equal to the
in-process one.

Step split: per step of ``raysim/ReachCamera`` (64 rows, the keypoint-CNN actor) and, where metaworld is installed,
``raysim/MetaWorld`` pick-place-v3 (10 rows, an MLP [256, 256]): ``env.step`` against ``Actor.sample`` under
``inference``, one torch thread, medians of ``--split-steps`` steps; the ceiling of overlapping the two is
(env + inference) / max(env, inference).

``raysim bench serving [--rounds 20] [--steps 20] [--warmups 3] [--split-steps 200] [--no-ray] [--tiny]
[--out FILE]``: the table to stdout; ``--out`` writes it to FILE and appends a JSON line to FILE's ``.jsonl``.
Ray starts here with 4 CPUs (or attaches to ``RAY_ADDRESS``) and is shut down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from raysim.config import load_config
from raysim.envs import BatchedEnv, make
from raysim.models import Actor, ModelConfig
from raysim.rollout.inference import inference
from raysim.rollout.server import ActRequest, PolicyServer

MEMCPY = "memcpy of the observations"
INPROC = "in-process PolicyServer.act"
RAY = "Ray call to a BatchingServer"
GRAPH = "Compiled Graph to a PolicyServer actor"
LOCAL_WAYS = (MEMCPY, INPROC)
RAY_WAYS = (RAY, GRAPH)
TIMELINE = "bench"
SIDE_BY_SIDE = {"worker_niceness": 0}  # Ray's workers at the driver's niceness (raysim.bench.collect)
TINY = {"rows": 4, "rounds": 2, "steps": 3, "warmups": 1, "split_steps": 5}


@dataclass
class Case:
    """A request's source: ``rows`` rows of ``config``'s env and actor (``hidden_sizes`` replaces the config's)."""

    name: str
    config: str
    rows: int
    hidden_sizes: list[int] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, seed: int = 0) -> tuple[BatchedEnv, Actor, ModelConfig]:
        """The env and the actor of this case (the actor's initial weights from ``seed``)."""
        config = load_config(self.config)
        model = config.model if self.hidden_sizes is None else replace(config.model, hidden_sizes=self.hidden_sizes)
        env = make(config.env.id, self.rows, seed=seed, **{**config.env.kwargs, **self.env_kwargs})
        torch.manual_seed(seed)
        return env, Actor(env.observation_spaces, env.action_space, model), model


@dataclass
class Setup:
    """What a worker and its servers need: the spaces, the actor's config and weights, one step's request."""

    spaces: dict[str, gym.Space]
    action_space: gym.Space
    model: ModelConfig
    weights: dict[str, Any]
    request: ActRequest

    @classmethod
    def of(cls, case: Case, seed: int = 0) -> Setup:
        env, actor, model = case.build(seed)
        obs = env.reset(seed)
        draws = actor.draws(case.rows, torch.Generator().manual_seed(seed))
        request = ActRequest(key=(TIMELINE, 1), obs={g: obs[g].clone() for g in actor.inputs}, draws=draws)
        weights = {"version": 1, "timeline": TIMELINE, "actor": actor.state_dict()}
        spaces, action_space = env.observation_spaces, env.action_space
        env.close()
        return cls(spaces, action_space, model, weights, request)

    def server(self) -> PolicyServer:
        server = PolicyServer(self.spaces, self.action_space, self.model)
        server.load(self.weights)
        return server

    def obs_bytes(self) -> int:
        return sum(t.nbytes for t in self.request.obs.values())


class StepProbe:
    """An env worker's step, asked of each way; ``time`` gives ms per step (a Ray actor for the Ray ways).

    The graph exists only while its way is timed: compiled at the start of each of its rounds (the compile times are
    kept) and torn down at the end, since its server spins on its input channel while idle (``idle_cpu``) and would
    take a core from the other ways."""

    def __init__(self, setup: Setup):
        torch.set_num_threads(1)
        self.request = setup.request
        self.local = setup.server()
        self.expected = self.local.act(self.request).action
        self.scratch = {g: torch.empty_like(t) for g, t in self.request.obs.items()}
        self.server: Any = None
        self.graph_server: Any = None
        self.graph: Any = None
        self.compile_ms: list[float] = []

    def connect(self, server: Any, graph_server: Any) -> None:
        """Ask ``server`` (a ``BatchingServer`` actor) by plain calls and ``graph_server`` (a ``PolicyServer``
        actor) through a graph compiled here."""
        self.server, self.graph_server = server, graph_server
        self.check(self.ray_call())

    def check(self, reply: Any) -> None:
        if not torch.equal(reply.action, self.expected):
            raise AssertionError("a server's actions differ from the in-process server's")

    def time(self, way: str, steps: int) -> list[float]:
        if way == GRAPH:
            self.compile()
        try:
            return timed(
                {MEMCPY: self.memcpy, INPROC: self.act_here, RAY: self.ray_call, GRAPH: self.graph_call}[way], steps
            )
        finally:
            self.teardown()

    def compile(self) -> None:
        """Compile the graph to the server here (kept in ``compile_ms``); its first reply is checked."""
        from ray.dag import InputNode

        start = time.perf_counter()
        with InputNode() as request:
            self.graph = self.graph_server.act.bind(request).experimental_compile()
        self.compile_ms.append((time.perf_counter() - start) * 1e3)
        self.check(self.graph_call())

    def teardown(self) -> None:
        """Tear the graph down (in the process that compiled it)."""
        if self.graph is not None:
            self.graph.teardown()
            self.graph = None

    def idle_cpu(self, pid: int, seconds: float = 1.0) -> float:
        """The CPU share (% of a core) process ``pid`` (the graph's server) takes while a compiled graph idles."""
        self.compile()
        try:
            before, start = cpu_seconds(pid), time.perf_counter()
            time.sleep(seconds)
            return 100 * (cpu_seconds(pid) - before) / (time.perf_counter() - start)
        finally:
            self.teardown()

    def memcpy(self) -> None:
        for group, tensor in self.request.obs.items():
            self.scratch[group].copy_(tensor)

    def act_here(self) -> Any:
        return self.local.act(self.request)

    def ray_call(self) -> Any:
        import ray

        return ray.get(self.server.act.remote(self.request))

    def graph_call(self) -> Any:
        return self.graph.execute(self.request).get()


def timed(step: Callable[[], Any], steps: int) -> list[float]:
    """ms of each of ``steps`` calls of ``step``."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux's ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cases(rows: int) -> list[Case]:
    return [
        Case(f"camera Reach, {rows} rows", "reach_camera_ppo", rows),
        Case(f"CartPole, {rows} rows", "cartpole_ppo", rows),
    ]


def rounds(
    probe_time: Callable[[str, int], list[float]], ways: tuple[str, ...], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Each way's step times over the measured rounds (rotating order, warm-ups dropped)."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    for r in range(args.warmups + args.rounds):
        order = ways[r % len(ways) :] + ways[: r % len(ways)]
        for way in order:
            measured = probe_time(way, args.steps)
            if r >= args.warmups:
                times[way] += measured
    return times


def round_trips(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The round-trip rows of every case: in this process (``--no-ray``) or in a worker actor with its servers."""
    results = []
    for case in cases(args.rows):
        setup = Setup.of(case)
        label = f"{case.name} ({setup.obs_bytes() / 1024:.1f} KiB obs)"
        if args.no_ray:
            probe = StepProbe(setup)
            times, extra = rounds(probe.time, LOCAL_WAYS, args), []
        else:
            times, extra = through_ray(setup, args)
        results += [summary(label, way, samples) for way, samples in times.items()]
        results += [{**row, "request": label} for row in extra]
    return results


def through_ray(setup: Setup, args: argparse.Namespace) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Every way timed in one worker actor against a ``BatchingServer`` and a ``PolicyServer`` actor; the graph's
    compile times and its server's CPU while idle."""
    import ray

    from raysim.rollout.server import BatchingServer

    server = ray.remote(BatchingServer).options(num_cpus=0).remote(setup.spaces, setup.action_space, setup.model)
    graph_server = ray.remote(PolicyServer).options(num_cpus=0).remote(setup.spaces, setup.action_space, setup.model)
    ray.get([server.load.remote(setup.weights), graph_server.load.remote(setup.weights)])
    worker = ray.remote(StepProbe).options(num_cpus=0).remote(setup)
    try:
        ray.get(worker.connect.remote(server, graph_server))
        times = rounds(lambda way, steps: ray.get(worker.time.remote(way, steps)), LOCAL_WAYS + RAY_WAYS, args)
        pid = ray.get(graph_server.__ray_call__.remote(lambda _: os.getpid()))
        idle = ray.get(worker.idle_cpu.remote(pid))
        compiles = ray.get(worker.__ray_call__.remote(lambda probe: probe.compile_ms))
    finally:
        for actor in (worker, server, graph_server):
            ray.kill(actor)
    extra = [
        summary("", "Compiled Graph: compile time", compiles),
        {"what": "Compiled Graph: its server's CPU while the graph idles", "value": idle, "unit": "% of a core"},
    ]
    return times, extra


def summary(request: str, what: str, samples: list[float]) -> dict[str, Any]:
    return {"request": request, "what": what, "median_ms": statistics.median(samples), "p90_ms": p90(samples)}


def p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[round(0.9 * (len(ordered) - 1))]


def step_split(case: Case, steps: int) -> list[dict[str, Any]]:
    """``env.step`` against ``Actor.sample`` per step of ``case``'s rows (one thread), and the pipelining ceiling."""
    torch.set_num_threads(1)
    env, actor, _ = case.build()
    generator = torch.Generator().manual_seed(0)
    obs, env_ms, inference_ms = env.reset(0), [], []
    with inference(actor):
        for _ in range(steps):
            start = time.perf_counter()
            action, _ = actor.sample(obs, generator)
            acted = time.perf_counter()
            obs = env.step(actor.env_action(action)).obs
            inference_ms.append((acted - start) * 1e3)
            env_ms.append((time.perf_counter() - acted) * 1e3)
    env.close()
    label = f"step split: {case.name}"
    rows = [summary(label, "env.step", env_ms), summary(label, "Actor.sample (inference)", inference_ms)]
    env_median, inference_median = rows[0]["median_ms"], rows[1]["median_ms"]
    ceiling = (env_median + inference_median) / max(env_median, inference_median)
    rows.append({"request": label, "what": "pipelining ceiling (env + inference) / max", "value": ceiling, "unit": "x"})
    return rows


def split_cases(rows: int, with_metaworld: bool) -> list[Case]:
    found = [Case(f"ReachCamera, {rows} rows, keypoint CNN", "reach_camera_ppo", rows)]
    if with_metaworld:
        task = {"benchmark": "MT1", "tasks": "pick-place-v3"}
        found.append(
            Case("MetaWorld pick-place-v3, 10 rows, MLP [256, 256]", "metaworld_pick_place_ppo", 10, [256, 256], task)
        )
    return found


def table(results: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| request | measured | median ms | p90 ms |", "|---|---|---|---|"]
    for row in results:
        if "value" in row:
            lines.append(f"| {row['request']} | {row['what']} | {row['value']:.2f} {row['unit']} | |")
        else:
            lines.append(f"| {row['request']} | {row['what']} | {row['median_ms']:.3f} | {row['p90_ms']:.3f} |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="rows of a request and of the camera split")
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds of the round trips")
    parser.add_argument("--steps", type=int, default=20, help="steps of each way per round")
    parser.add_argument("--warmups", type=int, default=3, help="rounds dropped first")
    parser.add_argument("--split-steps", type=int, default=200, help="steps of each step split")
    parser.add_argument("--no-ray", action="store_true", help="the in-process ways only (no Ray started)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 4 rows, few steps, no Meta-World")
    parser.add_argument("--out", type=Path, help="write the table here and append a JSON line to its .jsonl")
    args = parser.parse_args(argv)
    if args.tiny:
        vars(args).update(TINY)
    if min(args.rows, args.rounds, args.steps, args.split_steps) < 1 or args.warmups < 0:
        parser.error("--rows, --rounds, --steps and --split-steps must be >= 1, --warmups >= 0")
    return args


def start_ray() -> None:
    """Attach to ``RAY_ADDRESS`` or start a local Ray of 4 CPUs (the workers' log lines stay in their log files)."""
    import ray

    quiet = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)
    else:
        ray.init(address="local", num_cpus=4, _system_config=SIDE_BY_SIDE, **quiet)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    import importlib.util

    results = []
    if not args.no_ray:
        start_ray()
    try:
        results += round_trips(args)
    finally:
        if not args.no_ray:
            import ray

            ray.shutdown()
    with_metaworld = not args.tiny and importlib.util.find_spec("metaworld") is not None
    for case in split_cases(args.rows, with_metaworld):
        results += step_split(case, args.split_steps)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load_before = os.getloadavg()[0]
    results = measure(args)
    load_after = os.getloadavg()[0]
    ray_version = "none" if args.no_ray else __import__("ray").__version__
    header = (
        f"Policy serving per step (torch {torch.__version__}, Ray {ray_version}, 1 torch thread; "
        f"{args.rounds} rounds x {args.steps} steps after {args.warmups} warm-ups; "
        f"load average {load_before:.2f} at start, {load_after:.2f} at end)"
    )
    text = table(results, header)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        line = {"bench": "serving", "load": [load_before, load_after], "ray": ray_version, "rows": results}
        with open(args.out.with_suffix(".jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0
