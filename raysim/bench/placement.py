"""Placement benchmark: collocated shards (each with its own actor) against env workers and a policy server
(``shards.placement: servers``), side by side in one run.

Weights: ``--workers`` (8) collocated ``EnvShard`` actors against as many env workers and one ``BatchingServer``
(``raysim.coordinator.servers.Servers``), for CartPole with a large actor (``model.hidden_sizes: [H, H]``,
``--hidden`` 3600: about 52 MB of float32). Each repeat is one iteration, a new version of the weights every time:
collocated, every shard receives the weights with its collection; servers, each server loads them once
(``Servers.load``) and each worker receives its server's key. Every role then collects a chunk of
``--weights-steps`` steps. After the repeats, each role is asked what it holds (``held_policy``: the actor versions
and their parameter and buffer bytes) and its process's unique memory (USS, psutil) is read; the bytes moved per
iteration are counted from the calls made (the pickled weights per load, the pickled key per worker). Targets: the
resident policy bytes summed over roles and the weight bytes moved per iteration both >= 4x lower with servers. The
iteration's time is a row too.

Speed: env steps/s of collection only (the version loaded once, then ``--chunks`` chunks of ``--speed-steps`` steps
from every shard, fetched by the driver) with ``--speed-shards`` (2) collocated shards against as many workers and
one server: Meta-World pick-place-v3 at 10 rows per worker (``metaworld_pick_place_ppo``'s env and actor), where the
simulator dominates (target: servers >= 0.9x collocated), and CartPole at 64 rows (``cartpole_ppo``), where a
step's inference round trip dominates (no target: the cost of the placement).

Each repeat times both placements, in an order that rotates every repeat; the first ``--warmups`` are dropped;
medians, their ratio, and the median of each repeat's own ratio ("paired"). Ray starts here (``--num-cpus``
logical CPUs, enough for every role; the real cores are what ``os.cpu_count`` says) and is shut down at the end;
``--local`` runs every role in this process instead (no Ray, no USS: a smoke run).
``raysim bench placement [--tiny] [--local] [--out FILE]``: the table to stdout; ``--out`` writes it to FILE and
appends a JSON line (machine, load, dates) to FILE's ``.jsonl``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from raysim.actors import Backend, Handle, LocalBackend
from raysim.bench.results import load, machine, now
from raysim.config import Config, load_config
from raysim.coordinator.roles import create_shard
from raysim.coordinator.servers import Servers
from raysim.models import Actor
from raysim.rollout import EnvShard
from raysim.rollout.server import BatchingServer, PolicyServer

COLLOCATED, SERVERS = "collocated", "servers"
TIMELINE = "bench"
WEIGHTS_CONFIG = "cartpole_ppo"
SHARD_CPUS, SERVER_CPUS = 0.5, 1.0  # logical CPUs per role: both placements' roles fit in --num-cpus at once
SIDE_BY_SIDE = {"worker_niceness": 0}  # Ray's workers at the driver's niceness (raysim.bench.collect)
MB = 1e6
TINY = {
    "workers": 4,
    "hidden": 16,
    "weights_rows": 2,
    "weights_steps": 3,
    "speed_rows": 4,
    "speed_steps": 3,
    "chunks": 1,
    "repeats": 2,
    "warmups": 1,
}


@dataclass
class SpeedCase:
    """A speed comparison: ``config``'s env and actor, ``rows`` rows per shard; ``target``: servers / collocated."""

    name: str
    config: str
    rows: int
    target: float | None


@dataclass
class Row:
    """A line of the table; ``ratio`` is better when higher (collocated / servers for bytes, servers / collocated
    for speed), ``target`` the issue's bound on it; ``paired``: for timings, the median of each repeat's own ratio
    (robust to a load that drifts between repeats); ``values`` the numbers behind the text."""

    part: str
    measure: str
    collocated: str
    servers: str
    ratio: float | None = None
    target: float | None = None
    values: dict[str, Any] = field(default_factory=dict)
    paired: float | None = None

    def cells(self) -> list[str]:
        ratio = "" if self.ratio is None else f"{self.ratio:.2f}x"
        if self.paired is not None:
            ratio += f" (paired {self.paired:.2f}x)"
        target = (
            "" if self.target is None else f">= {self.target:g}x: {'met' if self.ratio >= self.target else 'NOT met'}"
        )
        return [self.part, self.measure, self.collocated, self.servers, ratio, target]


class Placement:
    """One placement's roles on ``backend``: ``shards.count`` collocated shards, or as many env workers and their
    ``Servers`` (``spaces``: the env's observation spaces and action space, which servers need)."""

    def __init__(self, backend: Backend, config: Config, spaces: tuple | None = None):
        self.name, self.backend, self.config = config.shards.placement, backend, config
        self.servers = Servers(backend, config, spaces) if self.name == SERVERS else None
        self.shards = [create_shard(backend, config, i, servers=self.servers) for i in range(config.shards.count)]
        probes = [s.call(EnvShard.spaces) for s in self.shards] + [h.call(PolicyServer.held) for h in self.handles]
        self.spaces = backend.get(probes)[0][:2]  # every role started

    @property
    def handles(self) -> list[Handle]:
        return [] if self.servers is None else self.servers.handles

    def roles(self) -> list[tuple[str, Handle]]:
        """``(kind, handle)`` of every role: shards, or workers then servers."""
        kind = "shard" if self.servers is None else "worker"
        return [(kind, s) for s in self.shards] + [("server", h) for h in self.handles]

    def deliver(self, weights: Any) -> list[Any]:
        """What each shard's collection takes to act with ``weights`` (a put value): the weights themselves, or the
        key that its server returns once it loaded them (futures, once per server)."""
        if self.servers is None:
            return [weights] * len(self.shards)
        keys = self.servers.load(weights)
        return [keys[self.servers.of(i)] for i in range(len(self.shards))]

    def collect(self, sent: list[Any], steps: int) -> list[Any]:
        """A chunk of ``steps`` steps from every shard, acting with ``sent`` (``deliver``)."""
        return self.backend.get([s.call(EnvShard.rollout, w, steps) for s, w in zip(self.shards, sent, strict=True)])

    def close(self) -> None:
        for _, handle in self.roles():
            self.backend.kill(handle)


def held_policy(role: Any) -> tuple[int, int, int]:
    """A role's process id, the actor versions it holds and their parameter and buffer bytes (an ``EnvShard``: its
    actor, none on a worker; a server: every version it keeps)."""
    if isinstance(role, EnvShard):
        actors = [] if role.actor is None else [role.actor]
    else:
        server = role.server if isinstance(role, BatchingServer) else role
        actors = [acting.actor for acting in server.versions.values()]
    return os.getpid(), len(actors), sum(state_bytes(actor) for actor in actors)


def size(count: float) -> str:
    """``count`` bytes in B, kB or MB (10^3, 10^6)."""
    if count >= MB:
        return f"{count / MB:,.1f} MB"
    return f"{count / 1e3:.1f} kB" if count >= 1e3 else f"{count:.0f} B"


def state_bytes(actor: torch.nn.Module) -> int:
    """The bytes of the actor's ``state_dict`` (parameters and buffers)."""
    return sum(t.nbytes for t in actor.state_dict().values())


def on_role(backend: Backend, handle: Handle, fn: Any) -> Any:
    """``fn(role)`` run in the role's process (Ray: ``__ray_call__``), its result."""
    if backend.name == "local":
        return fn(handle.instance)
    return backend.get(handle.actor.__ray_call__.remote(fn))


def uss(pid: int) -> int:
    """The unique set size of process ``pid``: the memory freed if it exited (psutil, which Ray ships)."""
    import psutil

    return psutil.Process(pid).memory_full_info().uss


def placement_config(name: str, placement: str, count: int, rows: int, overrides: Sequence[str] = ()) -> Config:
    """``name``'s config with ``count`` shards of ``rows`` rows in ``placement`` (one server)."""
    return load_config(
        name,
        [
            *overrides,
            f"shards.placement={placement}",
            f"shards.count={count}",
            f"env.num_envs={rows}",
            f"shards.num_cpus={SHARD_CPUS}",
            f"servers.num_cpus={SERVER_CPUS}",
        ],
    )


def start_both(backend: Backend, name: str, count: int, rows: int, overrides: Sequence[str] = ()) -> list[Placement]:
    """The collocated placement, then the servers one (both of ``count`` shards of ``rows`` rows)."""
    collocated = Placement(backend, placement_config(name, COLLOCATED, count, rows, overrides))
    try:
        servers = Placement(backend, placement_config(name, SERVERS, count, rows, overrides), collocated.spaces)
    except BaseException:
        collocated.close()
        raise
    return [collocated, servers]


def weights_of(placement: Placement, version: int) -> dict[str, Any]:
    """Weights of version ``version`` (a learner's ``get_weights``): the placement's actor from seed 0."""
    torch.manual_seed(0)
    actor = Actor(*placement.spaces, placement.config.model)
    return {"version": version, "timeline": TIMELINE, "actor": actor.state_dict()}


def rotated(placements: list[Placement], repeat: int) -> list[Placement]:
    shift = repeat % len(placements)
    return placements[shift:] + placements[:shift]


def weights_part(backend: Backend, args: argparse.Namespace) -> list[Row]:
    """Resident policy bytes, weight bytes moved per iteration, USS and an iteration's time, both placements."""
    overrides = [f"model.hidden_sizes=[{args.hidden},{args.hidden}]"]
    placements = start_both(backend, WEIGHTS_CONFIG, args.workers, args.weights_rows, overrides)
    times: dict[str, list[float]] = {p.name: [] for p in placements}
    try:
        weights = weights_of(placements[0], 1)
        for repeat in range(args.warmups + args.repeats):
            put = backend.put({**weights, "version": repeat + 1})  # a new version every iteration
            for placement in rotated(placements, repeat):
                start = time.perf_counter()
                placement.collect(placement.deliver(put), args.weights_steps)
                if repeat >= args.warmups:
                    times[placement.name].append((time.perf_counter() - start) * 1e3)
        held = {p.name: [role_memory(backend, kind, h) for kind, h in p.roles()] for p in placements}
    finally:
        for placement in placements:
            placement.close()
    return weight_rows(args, weights, held, times)


def role_memory(backend: Backend, kind: str, handle: Handle) -> dict[str, Any]:
    """What a role holds (``held_policy``) and its process's USS (None in process: every role shares this one)."""
    pid, versions, held = on_role(backend, handle, held_policy)
    return {
        "kind": kind,
        "pid": pid,
        "versions": versions,
        "bytes": held,
        "uss": None if backend.name == "local" else uss(pid),
    }


def weight_rows(
    args: argparse.Namespace, weights: dict[str, Any], held: dict[str, list[dict]], times: dict[str, list[float]]
) -> list[Row]:
    """The weights part's rows: the bytes counted from the calls made and from what the roles hold."""
    actor = sum(t.nbytes for t in weights["actor"].values())
    sent, key = len(pickle.dumps(weights)), len(pickle.dumps((TIMELINE, 1)))
    workers, servers = args.workers, sum(r["kind"] == "server" for r in held[SERVERS])
    layout = f"{workers} shards / {workers} workers + {servers} server"
    part = f"weights: CartPole, actor [{args.hidden}, {args.hidden}]; {layout}"
    resident = {name: sum(r["bytes"] for r in roles) for name, roles in held.items()}
    moved = {COLLOCATED: workers * sent, SERVERS: servers * sent + workers * key}
    rows = [
        Row(part, "actor state_dict, one copy", *[f"{actor:,} B ({size(actor)})"] * 2, values={"bytes": actor}),
        Row(
            part,
            "resident policy bytes per role (versions held)",
            per_kind(held[COLLOCATED], held_text),
            per_kind(held[SERVERS], held_text),
            values={
                name: [{k: r[k] for k in ("kind", "versions", "bytes")} for r in roles] for name, roles in held.items()
            },
        ),
        Row(
            part,
            "resident policy bytes, all roles (collocated / servers)",
            size(resident[COLLOCATED]),
            size(resident[SERVERS]),
            resident[COLLOCATED] / resident[SERVERS],
            4.0,
            resident,
        ),
        Row(
            part,
            "weight bytes moved per iteration, pickled (collocated / servers)",
            f"{workers} x {size(sent)} = {size(moved[COLLOCATED])}",
            f"{servers} x {size(sent)} + {workers} x {size(key)} = {size(moved[SERVERS])}",
            moved[COLLOCATED] / moved[SERVERS],
            4.0,
            {**moved, "weights": sent, "key": key},
        ),
    ]
    rows += uss_rows(part, held)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    rows.append(
        Row(
            part,
            f"iteration: a new version + {args.weights_steps} steps x {args.weights_rows} rows per shard, "
            "median ms (collocated / servers)",
            f"{medians[COLLOCATED]:.0f}",
            f"{medians[SERVERS]:.0f}",
            medians[COLLOCATED] / medians[SERVERS],
            values=times,
            paired=paired(times[COLLOCATED], times[SERVERS]),
        )
    )
    return rows


def uss_rows(part: str, held: dict[str, list[dict]]) -> list[Row]:
    """Each role's unique memory and their sum, both placements (none without Ray: ``--local``)."""
    if held[COLLOCATED][0]["uss"] is None:
        return []
    total = {name: sum(r["uss"] for r in roles) for name, roles in held.items()}
    return [
        Row(
            part,
            "USS per role, median",
            per_kind(held[COLLOCATED], uss_text),
            per_kind(held[SERVERS], uss_text),
            values={name: [r["uss"] for r in roles] for name, roles in held.items()},
        ),
        Row(
            part,
            "USS, all roles (collocated / servers)",
            f"{total[COLLOCATED] / 2**20:,.0f} MiB",
            f"{total[SERVERS] / 2**20:,.0f} MiB",
            total[COLLOCATED] / total[SERVERS],
            values=total,
        ),
    ]


def per_kind(roles: list[dict], describe: Any) -> str:
    """``<count> <kind>s: describe(their roles)`` for each kind of role, in order."""
    kinds = dict.fromkeys(r["kind"] for r in roles)
    described = []
    for kind in kinds:
        mine = [r for r in roles if r["kind"] == kind]
        described.append(f"{len(mine)} {kind}{'s' if len(mine) > 1 else ''}: {describe(mine)}")
    return ", ".join(described)


def held_text(roles: list[dict]) -> str:
    """The bytes (versions) each role holds: one text when all hold alike."""
    texts = dict.fromkeys(f"{size(r['bytes'])} ({r['versions']})" for r in roles)
    return ("each " if len(texts) == 1 and len(roles) > 1 else "") + " / ".join(texts)


def uss_text(roles: list[dict]) -> str:
    return f"{statistics.median(r['uss'] for r in roles) / 2**20:,.0f} MiB"


def speed_cases(args: argparse.Namespace) -> list[SpeedCase]:
    """Meta-World pick-place-v3 (where metaworld is installed, not ``--tiny``) and CartPole."""
    cases = []
    if not args.tiny and importlib.util.find_spec("metaworld") is not None:
        cases.append(SpeedCase("Meta-World pick-place-v3", "metaworld_pick_place_ppo", args.speed_rows, 0.9))
    cases.append(SpeedCase("CartPole", "cartpole_ppo", args.cartpole_rows, None))
    return cases


def speed_part(backend: Backend, case: SpeedCase, args: argparse.Namespace) -> Row:
    """Env steps/s of collection only, both placements: the version loaded once, then ``--chunks`` chunks from
    every shard per repeat."""
    count, steps = args.speed_shards, args.speed_steps
    placements = start_both(backend, case.config, count, case.rows, [f"servers.pipeline={args.pipeline}"])
    rates: dict[str, list[float]] = {p.name: [] for p in placements}
    try:
        put = backend.put(weights_of(placements[0], 1))
        sent = {p.name: p.deliver(put) for p in placements}
        for repeat in range(args.warmups + args.repeats):
            for placement in rotated(placements, repeat):
                start = time.perf_counter()
                env_steps = sum(
                    c.env_steps for _ in range(args.chunks) for c in placement.collect(sent[placement.name], steps)
                )
                if repeat >= args.warmups:
                    rates[placement.name].append(env_steps / (time.perf_counter() - start))
    finally:
        for placement in placements:
            placement.close()
    medians = {name: statistics.median(samples) for name, samples in rates.items()}
    return Row(
        f"speed: {case.name}",
        f"env steps/s, {count} shards x {case.rows} rows x {steps} steps x {args.chunks} chunks, median "
        f"(servers{f' pipelined in {args.pipeline} groups' if args.pipeline > 1 else ''} / collocated)",
        f"{medians[COLLOCATED]:,.0f}",
        f"{medians[SERVERS]:,.0f}",
        medians[SERVERS] / medians[COLLOCATED],
        case.target,
        rates,
        paired(rates[SERVERS], rates[COLLOCATED]),
    )


def paired(numerators: list[float], denominators: list[float]) -> float:
    """The median over repeats of each repeat's ratio (both placements were timed in the same repeat)."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def table(rows: list[Row], header: str) -> str:
    lines = [header, "", "| part | measure | collocated | servers | ratio | target |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench placement", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="collocated shards, and env workers (weights part)")
    parser.add_argument("--hidden", type=int, default=3600, help="the weights part's actor: hidden_sizes [H, H]")
    parser.add_argument("--weights-rows", type=int, default=8, help="rows per shard in the weights part")
    parser.add_argument("--weights-steps", type=int, default=16, help="steps of the weights part's chunks")
    parser.add_argument("--speed-shards", type=int, default=2, help="collocated shards, and env workers (speed)")
    parser.add_argument("--speed-rows", type=int, default=10, help="Meta-World rows per shard")
    parser.add_argument("--cartpole-rows", type=int, default=64, help="CartPole rows per shard (speed)")
    parser.add_argument("--speed-steps", type=int, default=100, help="steps of the speed part's chunks")
    parser.add_argument("--chunks", type=int, default=3, help="chunks per shard in each speed measurement")
    parser.add_argument("--pipeline", type=int, default=1, help="the speed part's servers.pipeline (groups per worker)")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats of each placement")
    parser.add_argument("--warmups", type=int, default=1, help="repeats dropped first")
    parser.add_argument("--num-cpus", type=float, default=10, help="logical CPUs Ray is told (all roles must fit)")
    parser.add_argument("--local", action="store_true", help="every role in this process (no Ray, no USS)")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: a small actor, few rows and steps, CartPole")
    parser.add_argument("--out", type=Path, help="write the table here and append a JSON line to its .jsonl")
    args = parser.parse_args(argv)
    if args.tiny:
        vars(args).update(TINY, cartpole_rows=TINY["speed_rows"])
    counts = (args.workers, args.hidden, args.weights_rows, args.weights_steps, args.speed_shards, args.speed_rows)
    if min(*counts, args.cartpole_rows, args.speed_steps, args.chunks, args.repeats) < 1 or args.warmups < 0:
        parser.error("counts, sizes and --repeats must be >= 1, --warmups >= 0")
    return args


def start_ray(num_cpus: float) -> Backend:
    """A local Ray of ``num_cpus`` logical CPUs (the workers' log lines stay in their log files)."""
    import ray

    from raysim.actors import RayBackend

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _system_config=SIDE_BY_SIDE,
    )
    return RayBackend()


def measure(args: argparse.Namespace) -> list[Row]:
    backend = LocalBackend() if args.local else start_ray(args.num_cpus)
    try:
        rows = weights_part(backend, args)
        rows += [speed_part(backend, case, args) for case in speed_cases(args)]
    finally:
        if not args.local:
            import ray

            ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started, load_start = now(), load()
    rows = measure(args)
    finished, load_end = now(), load()
    ray_version = "none (--local)" if args.local else __import__("ray").__version__
    where = machine()
    header = (
        f"Placement: collocated shards against env workers + a policy server ({where['host']}, {where['cpus']} real "
        f"cores, Ray {ray_version} told {args.num_cpus:g} logical CPUs, torch {torch.__version__}, 1 torch thread per "
        f"role; {args.repeats} repeats after {args.warmups} warm-up(s), interleaved, medians; load average "
        f"{load_start} at start, {load_end} at end; {started} to {finished})"
    )
    text = table(rows, header)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        line = {
            "bench": "placement",
            **where,
            "ray": ray_version,
            "torch": torch.__version__,
            "num_cpus": args.num_cpus,
            "started": started,
            "finished": finished,
            "load_start": load_start,
            "load_end": load_end,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": [asdict(row) for row in rows],
        }
        with open(args.out.with_suffix(".jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0
