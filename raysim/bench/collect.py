"""Collection benchmark: raysim's EnvShard against CleanRL-style Gymnasium (and EnvPool) loops.

What one measurement is: collecting ``--steps`` (32) steps of CartPole for N rows with an FP32
actor and critic (ModelConfig defaults: MLPs [64, 64], Tanh), one torch thread, **from the request
until the learner side holds the complete chunk with values for every observation** (and, for
raysim, the terminal values of the eligible rows):

- ``raysim in-process``: ``chunk = shard.rollout(weights, T)`` then ``chunk_values(critic, chunk)``,
  with a new weights version every round so the shard loads the weights each time, as in training;
- ``raysim in-process, LSTM`` (and ``GRU``; ``--recurrent``): the same with a recurrent policy
  (``model.recurrent``, ``RECURRENT_SIZE`` units, the same MLPs): the shard steps each row's state in place
  (``CellInference``) and stores the core's outputs with the chunk, from which the learner side computes its
  values (``sequence_values`` of a chunk of its own weights), as PPO does; the report sets each beside the
  feed-forward row, recurrent / feed-forward, and beside its floor: the feed-forward row plus a bare
  ``nn.LSTMCell`` (``nn.GRUCell``) loop of T steps on N rows, measured in the same rounds;
- ``raysim Ray actor``: the same shard as a Ray actor; the weights go in as an object ref from one
  ``ray.put`` per round, the chunk comes back with ``ray.get`` and the driver (playing the learner)
  computes the values: one request's latency, round trip included;
- ``raysim Ray actor, steady state``: a shard actor like it collecting chunk after chunk as in training with
  ``algo.max_policy_lag: 1`` (its next collection always queued, so it never waits for the driver): one
  ``ray.put`` of the weights per round, then ``STEADY_CHUNKS`` chunks, each taken by the driver, which
  computes its values while the shard collects the next; the time per chunk is the round's time over
  ``STEADY_CHUNKS`` (the first chunk's latency, filling the pipeline, included);
- the baselines run CleanRL's ``ppo.py`` rollout loop (actor logits, Categorical sample and
  log-prob, critic value, ``env.step``, preallocated torch buffers, then the bootstrap value of the
  last observation) over Gymnasium's ``SyncVectorEnv``, Gymnasium's native ``CartPoleVectorEnv``
  and, when it is installed, EnvPool.

The rows run alternately within each round (the order rotates every round), so drifting machine
noise hits them all alike; the first ``--warmups`` rounds are discarded and the median (and
min / max) of the ``--samples`` rounds is reported. The compute floor is the matrix work no
collector can avoid: T actor forwards on [N, obs] and one critic forward on all (T+1)*N
observations, same torch, same thread, no autograd, through the cheapest forward available
(``MLPInference``, blocked critic values), with raysim's networks.

The image rows (``--images``, on by default, off with ``--quick`` or ``--no-ray``; ``raysim.bench.images``)
time a camera Reach and an Atari-sized chunk from a shard actor to a learner actor against a bare NumPy
array of the same bytes and a memcpy of them, with the peak RSS of both actors and the driver.

Run ``raysim bench collect`` (or ``python benchmarks/collect.py`` in a checkout); ``--quick`` is a
few-second smoke run. The output is Markdown.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from raysim.bench.peers import MISSING, peer_module

if TYPE_CHECKING:
    from raysim.models import ActorCritic, ModelConfig

ENV_ID = "raysim/CartPole"
GYM_ID = "CartPole-v1"

INPROC = "raysim in-process"
LSTM = "raysim in-process, LSTM"
GRU = "raysim in-process, GRU"
RECURRENT_ROWS = {"lstm": LSTM, "gru": GRU}  # model.recurrent -> its row
CELL_ROWS = {"lstm": "bare LSTMCell loop", "gru": "bare GRUCell loop"}  # model.recurrent -> its arithmetic floor
RECURRENT_SIZE = 64  # model.recurrent_size of the recurrent rows
RAY = "raysim Ray actor"
STEADY = "raysim Ray actor, steady state"
SYNC = "Gymnasium SyncVectorEnv"
NATIVE = "Gymnasium CartPoleVectorEnv"
ENVPOOL = "EnvPool"
FLOOR = "compute floor"
ROWS = (INPROC, LSTM, GRU, RAY, STEADY, SYNC, NATIVE, ENVPOOL)
STEADY_CHUNKS = 16  # chunks per round of the steady-state row
QUEUED = 2  # collections queued on the steady-state shard (max_policy_lag + 1, as the Collector keeps)

DEFAULT_ENVS = [1, 64, 1024]
#: Ray starts its workers with niceness 15: on a busy machine they then lose the CPU to every
#: other process, the in-process rows (niceness 0) included. Side by side, all run at 0.
SIDE_BY_SIDE = {"worker_niceness": 0}
QUICK = {"envs": [1, 64], "warmups": 1, "samples": 3}


@dataclass
class Row:
    """One collector: ``collect(version)`` does ``chunks`` complete collections; ``close()`` frees it."""

    name: str
    collect: Callable[[int], Any]
    close: Callable[[], None] = lambda: None
    chunks: int = 1  # the time per chunk is a call's time over this


@dataclass
class Results:
    times: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (row, N) -> ms per sample
    skipped: dict[str, str] = field(default_factory=dict)  # row -> why
    peak_rss_mib: dict[int, float] = field(default_factory=dict)  # N -> ru_maxrss after its run

    def median(self, row: str, n: int) -> float | None:
        samples = self.times.get((row, n))
        return statistics.median(samples) if samples else None


# -- the collectors ---------------------------------------------------------------------------


def _raysim_rows(n: int, steps: int, seed: int, use_ray: bool, results: Results):
    """The learner-side model, the in-process shard row and (optionally) the Ray actor rows."""
    from raysim.models import ModelConfig
    from raysim.rollout.advantages import chunk_values

    model, row = inproc_row(INPROC, n, steps, seed, ModelConfig())
    rows = [row]
    if use_ray and RAY not in results.skipped:
        try:
            rows += _ray_rows(n, steps, seed, model, chunk_values)
        except Exception as error:  # no Ray, or it would not start: measure the rest
            results.skipped[RAY] = f"{type(error).__name__}: {error}"
    return model, rows


def inproc_row(
    name: str,
    n: int,
    steps: int,
    seed: int,
    config: ModelConfig,
    env_id: str = ENV_ID,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[ActorCritic, Row]:
    """A shard in this process and the learner-side model: ``shard.rollout(weights, T)``, then the chunk's values
    as PPO computes them (``sequence_values`` for a recurrent model, else ``chunk_values``).
    ``env_id`` / ``env_kwargs``: the shard's env (CartPole unless given; ``raysim bench metaworld`` gives its own)."""
    from raysim.models import ActorCritic
    from raysim.rollout.advantages import chunk_values, sequence_values
    from raysim.rollout.shard import EnvShard

    shard = EnvShard(env_id, n, seed=seed, model=config, env_kwargs=env_kwargs)
    observation_spaces, action_space = shard.spaces()[:2]  # (obs spaces, action space, ...)
    torch.manual_seed(seed)
    model = ActorCritic(observation_spaces, action_space, config)
    recurrent = model.actor.core is not None

    def inproc(version: int):
        weights = {"version": version, "actor": model.actor.state_dict()}
        chunk = shard.rollout(weights, steps)
        # a recurrent chunk of the model's own weights: its values read the core's outputs the shard stored, as PPO's
        values, next_values = (
            sequence_values(model, chunk, acted=True) if recurrent else chunk_values(model.critic, chunk)
        )
        return chunk, values, next_values

    return model, Row(name, inproc)


def _recurrent_rows(n: int, steps: int, seed: int, kinds: list[str]) -> list[Row]:
    """The in-process rows of the recurrent policies ``kinds`` (``--recurrent``): ``RECURRENT_SIZE`` units, the
    MLPs of the feed-forward row, so that recurrent / feed-forward is the cost of the recurrence alone."""
    from raysim.models import ModelConfig

    rows = []
    for kind in kinds:
        config = ModelConfig(recurrent=kind, recurrent_size=RECURRENT_SIZE)
        model, row = inproc_row(RECURRENT_ROWS[kind], n, steps, seed, config)
        rows += [row, _cell_row(kind, n, steps, model.actor.in_dim)]
    return rows


def _cell_row(kind: str, n: int, steps: int, in_dim: int) -> Row:
    """``steps`` steps of a bare ``nn.LSTMCell`` (``nn.GRUCell``) of ``RECURRENT_SIZE`` units on [N, ``in_dim``]
    inputs, no_grad: the recurrence's own arithmetic, the floor of what a recurrent row adds to the feed-forward one."""
    cell = (torch.nn.LSTMCell if kind == "lstm" else torch.nn.GRUCell)(in_dim, RECURRENT_SIZE)
    x = torch.randn(n, in_dim)

    def loop(version: int):
        with torch.no_grad():
            h = torch.zeros(n, RECURRENT_SIZE)
            state = (h, h) if kind == "lstm" else h
            for _ in range(steps):
                state = cell(x, state)
        return state

    return Row(CELL_ROWS[kind], loop)


def _ray_rows(n: int, steps: int, seed: int, model, chunk_values) -> list[Row]:
    """The Ray actor rows: one request's latency, and chunk after chunk (steady state), each its own actor."""
    import ray

    from raysim.rollout.shard import EnvShard

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", _system_config=SIDE_BY_SIDE)
    shard, steady = (ray.remote(EnvShard).options(num_cpus=1).remote(ENV_ID, n, seed=seed) for _ in range(2))
    ray.get([shard.spaces.remote(), steady.spaces.remote()])  # wait until the actors are up

    def collect(version: int):
        ref = ray.put({"version": version, "actor": model.actor.state_dict()})
        chunk = ray.get(shard.rollout.remote(ref, steps))
        values, next_values = chunk_values(model.critic, chunk)
        return chunk, values, next_values

    def collect_steadily(version: int):
        ref = ray.put({"version": version, "actor": model.actor.state_dict()})
        queued = [steady.rollout.remote(ref, steps) for _ in range(min(QUEUED, STEADY_CHUNKS))]
        for k in range(STEADY_CHUNKS):
            chunk = ray.get(queued.pop(0))
            if k + len(queued) + 1 < STEADY_CHUNKS:
                queued.append(steady.rollout.remote(ref, steps))
            values, next_values = chunk_values(model.critic, chunk)  # while the shard collects the next
        return chunk, values, next_values

    return [
        Row(RAY, collect, lambda: ray.kill(shard)),
        Row(STEADY, collect_steadily, lambda: ray.kill(steady), chunks=STEADY_CHUNKS),
    ]


def _floor_row(n: int, steps: int, model) -> Row:
    from raysim.models import MLPInference
    from raysim.rollout.advantages import critic_values

    obs_dim = model.critic.net[0].in_features
    step_obs = torch.randn(n, obs_dim)
    all_obs = {"policy": torch.randn((steps + 1) * n, obs_dim)}
    actor = MLPInference(model.actor.net)  # the cheapest forward this torch offers (fused, no allocation)

    def floor(version: int):
        with torch.no_grad():
            for _ in range(steps):
                actor(step_obs)
            return critic_values(model.critic, all_obs)

    return Row(FLOOR, floor)


# -- measuring --------------------------------------------------------------------------------


def _measure(n: int, args, results: Results) -> None:
    model, rows = _raysim_rows(n, args.steps, args.seed, not args.no_ray, results)
    rows += _recurrent_rows(n, args.steps, args.seed, args.recurrent)
    peers = peer_module("collect_peers")
    if peers is None:
        results.skipped["peers (Gymnasium, EnvPool)"] = MISSING
    else:
        rows += peers.rows(n, args.steps, args.seed, model, results, args.baseline_net)
    rows.append(_floor_row(n, args.steps, model))
    try:
        for rnd in range(args.warmups + args.samples):
            version = rnd + 1  # a new policy version every round: the shards load the weights each time
            shift = rnd % len(rows)
            gc.collect()
            for row in rows[shift:] + rows[:shift]:
                start = time.perf_counter()
                out = row.collect(version)
                elapsed = (time.perf_counter() - start) * 1e3 / row.chunks
                del out
                if rnd >= args.warmups:
                    results.times.setdefault((row.name, n), []).append(elapsed)
    finally:
        for row in rows:
            row.close()
    results.peak_rss_mib[n] = _peak_rss_mib()


def _measure_scale(args, results: Results) -> list[list[str]]:
    """Env steps/s of 1, 2, 4... Ray actor shards collecting in parallel (``--scale``).

    One round: one ``ray.put`` of the weights, every shard's ``rollout`` (``--scale-envs`` rows,
    ``--steps`` steps), until the driver holds all chunks (values not included: one learner
    computes them whatever the shard count). Parallel efficiency: the rate of S shards over S
    times the rate of one; with more shards than cores it cannot exceed cores / S.
    """
    import ray

    from raysim.models import Actor, ModelConfig
    from raysim.rollout.shard import EnvShard
    from raysim.seeding import derive_seed

    if not ray.is_initialized():
        ray.init(
            num_cpus=os.cpu_count() or 2, include_dashboard=False, logging_level="ERROR", _system_config=SIDE_BY_SIDE
        )
    cpus = ray.cluster_resources().get("CPU", 1.0)
    table, per_shard = [], None
    for count in sorted(args.scale):
        shards = [
            ray.remote(EnvShard)
            .options(num_cpus=min(1.0, cpus / count))
            .remote(ENV_ID, args.scale_envs, seed=derive_seed(args.seed, 12, i), shard_index=i)
            for i in range(count)
        ]
        try:
            spaces = ray.get(shards[0].spaces.remote())
            ray.get([s.spaces.remote() for s in shards])
            torch.manual_seed(args.seed)
            actor = Actor(spaces[0], spaces[1], ModelConfig()).state_dict()
            times = []
            for rnd in range(args.warmups + args.samples):
                gc.collect()
                start = time.perf_counter()
                ref = ray.put({"version": rnd + 1, "actor": actor})
                chunks = ray.get([s.rollout.remote(ref, args.steps) for s in shards])
                elapsed = time.perf_counter() - start
                del chunks, ref
                if rnd >= args.warmups:
                    times.append(elapsed)
        finally:
            for shard in shards:
                ray.kill(shard)
        med = statistics.median(times)
        rate = count * args.scale_envs * args.steps / med
        if per_shard is None:  # the first (smallest) count is the reference: its rate per shard
            per_shard = rate / count
        table.append(
            [
                str(count),
                str(count * args.scale_envs),
                _ms(med * 1e3),
                f"{rate:,.0f}",
                f"{rate / per_shard:.2f}x",
                f"{rate / (count * per_shard):.0%}",
            ]
        )
    return table


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


# -- reporting --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def _ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num is not None and den else "-"


def _table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def _header(args) -> str:
    import gymnasium

    versions = [f"torch {torch.__version__}", f"gymnasium {gymnasium.__version__}", f"numpy {np.__version__}"]
    if not args.no_ray:
        try:
            import ray

            versions.append(f"ray {ray.__version__}")
        except ImportError:
            pass
    return "\n".join(
        [
            "# raysim collection benchmark",
            "",
            f"Collection of {args.steps} steps of CartPole for N rows: from the request until the learner side holds",
            "the complete chunk with values for every observation (raysim: `shard.rollout(weights, T)` then",
            "`chunk_values(critic, chunk)`, terminal values of the eligible rows included; baselines: CleanRL's",
            "ppo.py rollout loop with its bootstrap value, networks: "
            f"{'CleanRL nn.Tanh' if args.baseline_net == 'cleanrl' else 'raysim modules'}). "
            "FP32 actor and critic MLPs [64, 64] Tanh, "
            f"{torch.get_num_threads()} torch thread,",
            f"seed {args.seed}, {args.warmups} warm-up and {args.samples} measured rounds per N, the rows alternating "
            "within each round; median ms (min-max).",
            *_recurrent_note(args),
            "",
            f"{', '.join(versions)}; Python {platform.python_version()}, {platform.machine()}, "
            f"{os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}; load average at start {_load()}",
        ]
    )


def _recurrent_note(args) -> list[str]:
    """What the recurrent rows (``--recurrent``) are, for the header; none without them."""
    if not args.recurrent:
        return []
    kinds = " and ".join(kind.upper() for kind in args.recurrent)
    return [
        f"Recurrent rows: {kinds} core of {RECURRENT_SIZE} units before the same actor MLP, in-process, the values by",
        "`sequence_values(model, chunk, acted=True)` (from the core's outputs the shard stored with the chunk).",
    ]


def _load() -> str:
    """The 1-minute load average: other work on the machine skews the figures."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def _measure_images(args) -> dict[str, Any]:
    """The image rows (``raysim.bench.images``), on the Ray the rows above use (started here if needed)."""
    import ray

    from raysim.bench.images import measure_images

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", _system_config=SIDE_BY_SIDE)
    start = time.perf_counter()
    found = measure_images(args)
    print(f"[images measured in {time.perf_counter() - start:.1f} s]", file=sys.stderr, flush=True)
    return found


def _report(
    args, envs: list[int], results: Results, scale: list[list[str]] | None = None, images: dict | None = None
) -> str:
    out = _time_tables(args, envs, results) + _recurrent_table(args, envs, results)
    out += _floor_and_memory(args, envs, results)
    if images:
        from raysim.bench.images import image_report

        out += image_report(args, images, _table)
    if scale:
        out += [
            "",
            f"## Scaling: Ray actor shards of {args.scale_envs} rows collecting {args.steps} steps in parallel "
            f"(one weights ref per round, chunks delivered to the driver; {os.cpu_count()} CPUs)",
            "",
            _table(
                ["shards", "rows", "median ms per round", "env steps/s", "speed-up vs 1 shard", "parallel efficiency"],
                scale,
            ),
            "",
            "A simulated multi-node cluster (ray.cluster_utils.Cluster) is not measured: "
            "its nodes would share these cores.",
        ]
    out += ["", f"Load average at the end: {_load()} (on {os.cpu_count()} CPUs)."]
    if results.skipped:
        out += ["", "Skipped rows:", ""] + [f"- {row}: {why}" for row, why in results.skipped.items()]
    return "\n".join(out)


def _time_tables(args, envs: list[int], results: Results) -> list[str]:
    """Every row's time per chunk, with speed-ups against the two Gymnasium baselines; the rows x N summary."""
    rows = [r for r in ROWS if any((r, n) in results.times for n in envs)]
    detail = []
    for n in envs:
        sync, native = results.median(SYNC, n), results.median(NATIVE, n)
        for row in rows:
            samples = results.times.get((row, n))
            if samples:
                med = statistics.median(samples)
                detail.append(
                    [
                        row,
                        str(n),
                        _ms(med),
                        f"{_ms(min(samples))}-{_ms(max(samples))}",
                        f"{args.steps * n / med * 1e3:,.0f}",
                        _ratio(sync, med),
                        _ratio(native, med),
                    ]
                )
    header = [
        "row",
        "N",
        "median ms",
        "min-max ms",
        "env steps/s",
        "speed-up vs SyncVectorEnv",
        "speed-up vs CartPoleVectorEnv",
    ]
    return [
        "## Collection time per chunk",
        "",
        _table(header, detail),
        "",
        "## Median ms, rows x N",
        "",
        _table(["row", *(f"N={n}" for n in envs)], [[r, *(_ms(results.median(r, n)) for n in envs)] for r in rows]),
    ]


def _recurrent_table(args, envs: list[int], results: Results) -> list[str]:
    """Each recurrent row beside the feed-forward in-process row at each N: env steps/s and the time ratio; and
    against its floor, the feed-forward row plus a bare cell loop of the same shapes (``_cell_row``)."""
    body = []
    for kind in args.recurrent:
        for n in envs:
            feed_forward, recurrent = results.median(INPROC, n), results.median(RECURRENT_ROWS[kind], n)
            cell = results.median(CELL_ROWS[kind], n)
            if feed_forward and recurrent:
                rates = (f"{args.steps * n / ms * 1e3:,.0f}" for ms in (feed_forward, recurrent))
                floor = feed_forward + cell if cell else None
                body.append(
                    [kind.upper(), str(n), *rates, _ratio(recurrent, feed_forward), _ms(cell), _ratio(recurrent, floor)]
                )
    if not body:
        return []
    header = [
        "policy",
        "N",
        "feed-forward env steps/s",
        "recurrent env steps/s",
        "time recurrent / feed-forward",
        "bare cell loop ms",
        "recurrent / (feed-forward + cell loop)",
    ]
    cells = " and ".join(f"`nn.{kind.upper()}Cell`" for kind in args.recurrent)  # LSTMCell, GRUCell
    return [
        "",
        f"## Recurrent policy ({RECURRENT_SIZE} units, the same MLPs) against feed-forward, in-process, values "
        "included (`sequence_values` against `chunk_values`)",
        "",
        _table(header, body),
        "",
        f"The bare cell loop: {args.steps} steps of {cells} of {RECURRENT_SIZE} units on N rows, no_grad, measured "
        "in the same rounds: the recurrence's own arithmetic, so feed-forward + cell loop is the floor of a recurrent "
        "row.",
    ]


def _floor_and_memory(args, envs: list[int], results: Results) -> list[str]:
    """The compute floor against the in-process shard, and the peak memory after each N."""
    floor_rows = []
    for n in envs:
        samples = results.times.get((FLOOR, n))
        if samples:
            med = statistics.median(samples)
            floor_rows.append(
                [
                    str(n),
                    f"{_ms(med)} ({_ms(min(samples))}-{_ms(max(samples))})",
                    _ms(results.median(INPROC, n)),
                    _ratio(results.median(INPROC, n), med),
                ]
            )
    return [
        "",
        f"## Compute floor: {args.steps} actor forwards on [N, 4] + one critic forward on "
        f"{args.steps + 1}*N observations (no_grad, same thread)",
        "",
        _table(
            ["N", "floor median ms (min-max)", "raysim in-process median ms", "raysim in-process / floor"], floor_rows
        ),
        "",
        "## Peak resident memory of this process (ru_maxrss; Ray's worker processes not included)",
        "",
        _table(["after N", "peak RSS MiB"], [[str(n), f"{results.peak_rss_mib[n]:.0f}"] for n in envs]),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raysim bench collect",
        description="Time the collection of one rollout chunk (CartPole) by raysim and by CleanRL-style baselines.",
    )
    parser.add_argument(
        "--envs", type=int, nargs="+", default=None, help=f"numbers of env rows (default {DEFAULT_ENVS})"
    )
    parser.add_argument("--warmups", type=int, default=None, help="discarded rounds per N (default 5)")
    parser.add_argument("--samples", type=int, default=None, help="measured rounds per N (default 15)")
    parser.add_argument("--steps", type=int, default=32, help="steps per chunk (default 32)")
    parser.add_argument(
        "--seed", type=int, default=42, help="seed of the envs, the model and the sampling (default 42)"
    )
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray actor rows (and do not start Ray)")
    parser.add_argument(
        "--baseline-net",
        choices=["cleanrl", "raysim"],
        default="cleanrl",
        help="networks of the baseline loops: CleanRL's (nn.Tanh; default) or raysim's modules (its cheaper Tanh)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        nargs="*",
        default=None,
        help="shard counts of the Ray scaling table (default 1 2 4; none with --quick or --no-ray)",
    )
    parser.add_argument(
        "--scale-envs", type=int, default=1024, help="rows per shard in the scaling table (default 1024)"
    )
    parser.add_argument(
        "--images",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the image rows: camera Reach and Atari-sized chunks from a shard actor to a learner actor "
        "(default: on, off with --quick or --no-ray)",
    )
    parser.add_argument(
        "--image-envs", type=int, default=64, help="rows of the image rows' chunks (default 64; --steps steps)"
    )
    parser.add_argument(
        "--recurrent",
        nargs="*",
        choices=sorted(RECURRENT_ROWS),
        default=["lstm"],
        help=f"recurrent policies measured in-process beside the feed-forward one ({RECURRENT_SIZE} units; "
        "default lstm; none when given no value)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: --envs 1 64 --warmups 1 --samples 3 unless given"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    base = QUICK if args.quick else {"envs": DEFAULT_ENVS, "warmups": 5, "samples": 15}
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if any(n < 1 for n in args.envs) or args.steps < 1 or args.samples < 1 or args.warmups < 0:
        parser.error("--envs, --steps and --samples must be >= 1 and --warmups >= 0")
    envs = list(dict.fromkeys(args.envs))
    args.recurrent = list(dict.fromkeys(args.recurrent))
    if args.scale is None:
        args.scale = [] if args.quick else [1, 2, 4]
    if args.images is None:
        args.images = not args.quick and not args.no_ray
    if args.images and args.no_ray:
        parser.error("--images needs Ray: leave out --no-ray")
    if args.image_envs < 1:
        parser.error("--image-envs must be >= 1")

    threads, rng_state = torch.get_num_threads(), torch.random.get_rng_state()
    ray_was_up = _ray_is_up() if not args.no_ray else True
    torch.set_num_threads(1)
    results = Results()
    try:
        print(_header(args), flush=True)
        for n in envs:
            start = time.perf_counter()
            _measure(n, args, results)
            print(f"[N={n} measured in {time.perf_counter() - start:.1f} s]", file=sys.stderr, flush=True)
        scale = None
        if args.scale and not args.no_ray:
            start = time.perf_counter()
            scale = _measure_scale(args, results)
            print(f"[scaling measured in {time.perf_counter() - start:.1f} s]", file=sys.stderr, flush=True)
        images = _measure_images(args) if args.images else None
        print()
        print(_report(args, envs, results, scale, images), flush=True)
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng_state)
        if not ray_was_up and _ray_is_up():
            sys.modules["ray"].shutdown()
    return 0


def _ray_is_up() -> bool:
    """Whether Ray was running before us (then it stays up afterwards); importing it is not starting it."""
    if "ray" not in sys.modules:
        return False
    return sys.modules["ray"].is_initialized()


if __name__ == "__main__":
    raise SystemExit(main())
