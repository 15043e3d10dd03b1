"""Side by side with RLlib: raysim's PPO and RLlib's on the same tasks, budgets, placement and machine.

Rows (``--rows``, all by default):

- ``cartpole``: time to solve CartPole-v1: RLlib on Gymnasium's ``CartPole-v1``, raysim on its native
  ``raysim/CartPole`` (``raysim``) and on Gymnasium's through the adapter (``raysim-gym``); both sides evaluate 100
  deterministic episodes every 10k env steps (evaluation time excluded) and stop at the first mean >= 475, within
  ``cartpole_ppo``'s budget (40k env steps); 5 seeds.
- ``hopper``: Hopper-v5, 1M env steps, 3 seeds: the final deterministic evaluation (``hopper_ppo``'s 20 episodes)
  and the training return of the last 10 episodes.
- ``reach``: Meta-World reach-v3 (RLlib through Gymnasium's ``Meta-World/MT1``, raysim through ``raysim/MetaWorld``),
  300k env steps, 1 seed: successes over ``metaworld_reach_ppo``'s 500 deterministic episodes.
- ``scale``: CartPole with 1, 2 and 4 shards / env runners of 1024 envs each (rollout 32), env steps/s.

raysim runs its packaged config (``--override`` adds overrides); RLlib runs ``benchmarks/rllib_ppo.py`` in its own
Python (``--rllib-python``; default ``$RAYSIM_RLLIB_PYTHON``, else ``.venv-rllib/bin/python``: an environment made
from ``benchmarks/rllib/requirements.txt``) with the settings of RLlib's example for the task and raysim's values for
env count, rollout length, network, minibatches, epochs and learning rate (``--rllib-settings aligned``; ``tuned``
keeps the example's), one env runner per shard with raysim's ``shards.num_cpus``, one learner in its own process.
Every run is a fresh process (a fresh Ray), the sides in turn, their order rotating from seed to seed. Each records:
env steps/s in steady state (after ``--warmup`` iterations), training seconds to the budget or to solve (evaluation
excluded) and Ray's start-up apart, the evaluations, the final deterministic evaluation, and the memory of the run's
process and every process under it (Ray's too): their summed PSS and USS, sampled every ``--memory-every`` seconds
(peak and median; RSS would count shared pages once per process). Each finished run is appended to
``results.jsonl`` in ``--out`` at once (the repository's recorded runs: ``benchmarks/results/rllib``), so a stopped
invocation loses only the run under way and the next one runs only what is missing. ``--table`` runs nothing: it
prints the tables of the results and writes them to ``rllib.md`` there (docs/benchmarks/rllib.md copies them).

``raysim bench rllib [--rows ...] [--seeds ...] [--steps N] [--peers ...] [--rllib-python PATH] [--out DIR]
[--table]``; ``--one PEER`` runs one raysim run in this process and prints its JSON line (what a row runs).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.bench.peers import SOURCE_BENCHMARKS
from raysim.bench.results import installed_version, load, machine, mean_std, now, read_results

RLLIB, RAYSIM, RAYSIM_GYM = "rllib", "raysim", "raysim-gym"
PEERS = (RLLIB, RAYSIM, RAYSIM_GYM)
ROWS = ("cartpole", "hopper", "reach", "scale")
RLLIB_PYTHON = ".venv-rllib/bin/python"
PEER_SCRIPT = SOURCE_BENCHMARKS / "rllib_ppo.py"
RECORDED = Path("benchmarks/results/rllib")  # the repository's recorded runs, relative to a checkout's root
RESULTS = "results.jsonl"
TABLE = "rllib.md"
VERSIONS = ("ray", "torch", "gymnasium", "mujoco", "metaworld", "numpy")
SOLVE, EVAL_EVERY = 475.0, 10_000
SCALE_SHARDS, SCALE_ENVS, SCALE_ROLLOUT, SCALE_ITERATIONS = (1, 2, 4), 1024, 32, 8
MIB = 2**20


@dataclass(frozen=True)
class Row:
    """A row: raysim's packaged ``config`` against RLlib's ``task``; ``solve`` the evaluation that ends a run."""

    name: str
    title: str
    config: str
    task: str
    peers: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int | None  # None: the config's train.total_steps
    solve: float | None = None
    shards: tuple[int, ...] = (0,)  # 0: the config's shards.count
    overrides: tuple[str, ...] = field(default=())


ROW_SPECS = {
    "cartpole": Row(
        "cartpole", "CartPole-v1: time to solve", "cartpole_ppo", "cartpole", PEERS, (1, 2, 3, 4, 5), None, SOLVE
    ),
    "hopper": Row("hopper", "Hopper-v5", "hopper_ppo", "hopper", (RLLIB, RAYSIM), (1, 2, 3), 1_000_000),
    "reach": Row("reach", "Meta-World reach-v3", "metaworld_reach_ppo", "reach", (RLLIB, RAYSIM), (1,), 300_000),
    "scale": Row(
        "scale",
        f"CartPole at {SCALE_ENVS} envs per shard / env runner",
        "cartpole_ppo",
        "cartpole",
        (RLLIB, RAYSIM),
        (1,),
        None,
        shards=SCALE_SHARDS,
        overrides=(f"env.num_envs={SCALE_ENVS}", f"algo.num_steps={SCALE_ROLLOUT}", "eval.episodes=0"),
    ),
}


@dataclass(frozen=True)
class Run:
    """One run of one side: ``row``'s task for ``peer`` at ``seed``, ``steps`` env steps, ``shards`` shards."""

    row: str
    peer: str
    seed: int
    steps: int
    shards: int
    settings: tuple[str, ...]  # raysim: its overrides; RLlib: "aligned" or "tuned", then raysim's overrides

    def key(self) -> tuple:
        return (self.row, self.peer, self.seed, self.steps, self.shards, self.settings)


def line_key(line: dict) -> tuple:
    """The ``Run.key`` of a results line."""
    return (line["row"], line["peer"], line["seed"], line["steps"], line["shards"], tuple(line["settings"]))


def raysim_config(row: Row, peer: str, seed: int, steps: int, shards: int, extra: list[str]):
    """raysim's config of a run: the packaged one, the row's overrides, the run's seed, budget and layout."""
    import raysim

    overrides = [*row.overrides, f"seed={seed}", f"train.total_steps={steps}", *extra]
    if shards:
        overrides.append(f"shards.count={shards}")
    if peer == RAYSIM_GYM:
        overrides.append("env.id=gym:CartPole-v1")
    if row.solve is not None:
        overrides += [f"eval.every_steps={EVAL_EVERY}", f"eval.stop_return={row.solve}"]
    return raysim.load_config(row.config, overrides)


def budget(row: Row, shards: int, args: argparse.Namespace) -> int:
    """The env steps of a run: ``--steps``, else the row's (scale: ``SCALE_ITERATIONS`` iterations)."""
    if args.steps is not None:
        return args.steps
    if row.name == "scale":
        return SCALE_ITERATIONS * shards * SCALE_ENVS * SCALE_ROLLOUT
    if row.steps is not None:
        return row.steps
    import raysim

    return raysim.load_config(row.config).train.total_steps


def steady(curve: list[list], warmup: int) -> float | None:
    """Env steps per training second after the first ``warmup`` iterations (all of them where the run is shorter);
    ``curve`` rows start ``[env_steps, training seconds, ...]``."""
    if not curve:
        return None
    first = curve[warmup - 1] if 0 < warmup < len(curve) else [0, 0.0]
    steps, seconds = curve[-1][0] - first[0], curve[-1][1] - first[1]
    return steps / seconds if seconds > 0 else None


def run_raysim(row: Row, run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """One raysim run in this process (a fresh embedded Ray unless its settings say ``backend=local``): the figures
    ``benchmarks/rllib_ppo.py`` reports for RLlib, from the run's summary and its metrics rows (one per iteration)."""
    import raysim
    from raysim.bench.mujoco import last_episodes_return
    from raysim.records import read_metrics
    from raysim.storage import open_storage

    with tempfile.TemporaryDirectory(prefix="raysim-bench-rllib-") as folder:
        logging = ["train.log_every=1", "train.sinks=[parquet]", f"run_dir={folder}/run", *run.settings]
        config = raysim_config(row, run.peer, run.seed, run.steps, run.shards, logging)
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result line alone
            summary = raysim.Trainer(config).train()
        rows = read_metrics(open_storage(f"{folder}/run"))
    curve = [[int(r["env_steps"]), r["time"], r.get("episode_return")] for r in rows]
    evals = [[int(r["env_steps"]), r["time"], r["eval_return"]] for r in rows if "eval_return" in r]
    report = summary.evaluation
    returns = [record["return"] for record in report.records] if report else []
    if returns and (not evals or evals[-1][0] != summary.env_steps):  # the final one, after the metrics rows
        evals.append([summary.env_steps, summary.wall_time, statistics.fmean(returns)])
    solved = summary.stopped_by == "solved"
    episodes = [(int(r["env_steps"]), r["episode_return"], int(r["episodes"])) for r in rows if r.get("episodes")]
    return {
        "env": config.env.id,
        "env_steps": summary.env_steps,
        "iterations": summary.iterations,
        "startup_seconds": summary.startup_time,
        "train_seconds": summary.wall_time,
        "steady_steps_per_s": steady(curve, args.warmup),
        "warmup_iterations": args.warmup,
        "solved": None if row.solve is None else solved,
        "solve_env_steps": summary.env_steps if solved else None,
        "solve_seconds": summary.wall_time if solved else None,
        "evals": evals,
        "eval_episodes": len(returns),
        "eval_mean": statistics.fmean(returns) if returns else None,
        "eval_std": statistics.pstdev(returns) if returns else None,
        "eval_successes": report.success_rate.numerator if report and report.success_rate is not None else None,
        "training_return": last_episodes_return(episodes),
        "curve": thinned(curve),
        "versions": {name: installed_version(name) for name in VERSIONS},
    }


def thinned(curve: list[list], points: int = 100) -> list[list]:
    """At most about ``points`` rows of a curve, the last one kept."""
    step = max(1, len(curve) // points)
    return curve[::step] + ([curve[-1]] if curve and (len(curve) - 1) % step else [])


def aligned_flags(config) -> list[str]:
    """``benchmarks/rllib_ppo.py``'s options that give RLlib raysim's values (``--rllib-settings aligned``)."""
    algo = config.algo
    return [
        *("--envs-per-runner", str(config.env.num_envs), "--rollout", str(algo.num_steps)),
        *("--minibatches", str(algo.num_minibatches), "--epochs", str(algo.update_epochs)),
        *("--lr", repr(algo.lr), "--lr-schedule", algo.lr_schedule),
        *("--hidden", *map(str, config.model.hidden_sizes), "--activation", config.model.activation),
    ]


def rllib_command(row: Row, run: Run, args: argparse.Namespace) -> list[str]:
    """The peer's command line: RLlib's example settings (aligned with raysim's config, the run's overrides with it,
    unless ``tuned``), raysim's placement (an env runner per shard of ``shards.num_cpus`` CPUs), the same
    evaluations and budget."""
    config = raysim_config(row, RAYSIM, run.seed, run.steps, run.shards, list(run.settings[1:]))
    command = [str(args.rllib_python), str(PEER_SCRIPT), "--task", row.task, "--seed", str(run.seed)]
    command += ["--steps", str(run.steps), "--env-runners", str(config.shards.count)]
    command += ["--cpus-per-runner", repr(config.shards.num_cpus), "--eval-episodes", str(config.eval.episodes)]
    command += ["--warmup", str(args.warmup)]
    if row.solve is not None:
        command += ["--eval-every", str(EVAL_EVERY), "--solve", repr(row.solve)]
    return command + (aligned_flags(config) if run.settings[0] == "aligned" else [])


def raysim_command(run: Run, args: argparse.Namespace) -> list[str]:
    """raysim's side in a fresh Python of this environment (``--one``)."""
    command = [sys.executable, "-m", "raysim.bench.rllib", "--one", run.peer, "--rows", run.row]
    command += ["--seeds", str(run.seed), "--steps", str(run.steps), "--warmup", str(args.warmup)]
    command += ["--shards", str(run.shards)] if run.shards else []  # none: the config's
    return command + [f"--override={override}" for override in run.settings]


def vendored_psutil():
    """psutil: installed, else the copy Ray ships (importing ray puts it on ``sys.path``)."""
    try:
        import psutil
    except ImportError:
        import ray  # noqa: F401 - puts the copy it ships on sys.path

        return importlib.import_module("psutil")
    return psutil


class MemorySampler:
    """The summed PSS and USS of process ``pid`` and every process under it (Ray's services and workers started by
    it), read every ``every`` seconds in a thread while the run goes on (``raysim bench placement`` reads a role's
    USS once; a run's processes come and go, so here they are sampled)."""

    def __init__(self, pid: int, every: float):
        self.psutil = vendored_psutil()
        self.root, self.every = self.psutil.Process(pid), every
        self.samples: list[tuple[int, int, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def _loop(self) -> None:
        while True:
            self.sample()
            if self.done.wait(self.every):
                return

    def sample(self) -> None:
        """One reading: PSS, USS and the number of processes of the tree."""
        gone = (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess)
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except gone:
            return
        pss = uss = count = 0
        for process in processes:
            try:
                info = process.memory_full_info()
            except gone:
                continue
            pss, uss, count = pss + info.pss, uss + info.uss, count + 1
        if count:
            self.samples.append((pss, uss, count))

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        pss, uss, counts = zip(*self.samples, strict=True)
        return {
            "pss_peak_mib": max(pss) / MIB,
            "pss_median_mib": statistics.median(pss) / MIB,
            "uss_peak_mib": max(uss) / MIB,
            "uss_median_mib": statistics.median(uss) / MIB,
            "processes_peak": max(counts),
            "samples": len(self.samples),
            "every_s": self.every,
        }


class RunFailed(RuntimeError):
    """A side's process ended without its result line."""


def run_process(command: list[str], every: float) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run one side's process, its memory sampled; its result line (the last ``"event": "result"`` line of its JSON
    lines on stdout; other lines pass to stderr) and its memory summary."""
    results = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            with MemorySampler(process.pid, every) as memory:
                for text in process.stdout:
                    try:
                        line = json.loads(text)
                    except json.JSONDecodeError:
                        line = None
                    if isinstance(line, dict) and line.get("event") == "result":
                        results.append(line)
                    else:  # progress: the iterations and evaluations, and anything else printed
                        print(text, end="", file=sys.stderr, flush=True)
        except BaseException:  # the bench stopped (Ctrl-C, SIGTERM): the run under way stops with it
            process.terminate()
            raise
        code = process.wait()
    if code != 0 or not results:
        raise RunFailed(f"{' '.join(command[:4])} ... exited {code} without its result (its output is above)")
    return results[-1], memory.summary()


def planned(args: argparse.Namespace) -> list[tuple[Row, Run]]:
    """Every run of the chosen rows, seeds and peers; per seed (and shard count) the sides in an order that rotates
    from one to the next, so that neither side always runs first."""
    runs, turn = [], 0
    for name in args.rows:
        row = ROW_SPECS[name]
        peers = [peer for peer in row.peers if peer in args.peers]
        counts = (args.shards or row.shards) if name == "scale" else row.shards
        for seed in args.seeds or row.seeds:
            for shards in counts:
                shift = turn % max(1, len(peers))
                for peer in peers[shift:] + peers[:shift]:
                    local = ("backend=local",) if args.local else ()  # apart from the runs on Ray
                    settings = (args.rllib_settings, *args.override) if peer == RLLIB else (*args.override, *local)
                    runs.append((row, Run(name, peer, seed, budget(row, shards, args), shards, settings)))
                turn += 1
    return runs


def record(row: Row, run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """Run one side (a fresh process, or this one with ``--local``) and return its results line."""
    started, load_start, begin = now(), load(), time.perf_counter()
    if args.local:
        result, memory = run_raysim(row, run, args), None
    else:
        command = rllib_command(row, run, args) if run.peer == RLLIB else raysim_command(run, args)
        result, memory = run_process(command, args.memory_every)
    result = {k: v for k, v in result.items() if k not in ("event", "task", "seed", "steps")}
    result["process_seconds"] = time.perf_counter() - begin  # the whole run: imports, evaluations, shutdown too
    return {
        "bench": "rllib",
        "row": run.row,
        "peer": run.peer,
        "seed": run.seed,
        "steps": run.steps,
        "shards": run.shards,
        "settings": list(run.settings),
        **result,
        "memory": memory,
        **machine(),
        "started": started,
        "finished": now(),
        "load_start": load_start,
        "load_end": load(),
    }


def measure(args: argparse.Namespace) -> int:
    """Every planned run not yet in ``results.jsonl``, each appended as it ends."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / RESULTS
    done = {line_key(line) for line in read_results(path)}
    stopping = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # ends the run under way
    try:
        return measure_runs(args, path, done)
    finally:
        signal.signal(signal.SIGTERM, stopping)


def measure_runs(args: argparse.Namespace, path: Path, done: set[tuple]) -> int:
    """The planned runs not ``done``, one after the other; 1 at the first that fails (those before it are kept)."""
    for row, run in planned(args):
        if run.key() in done:
            continue
        print(f"[{run.row} {run.peer} seed {run.seed}: {run.steps:,} env steps]", file=sys.stderr, flush=True)
        try:
            line = record(row, run, args)
        except RunFailed as error:
            print(f"raysim bench rllib: {error}", file=sys.stderr)
            return 1
        with open(path, "a") as f:  # at once: a stopped invocation loses only the run under way
            f.write(json.dumps(line) + "\n")
        done.add(run.key())
    return 0


def rllib_problem(python: Path) -> str | None:
    """Why RLlib's side cannot run with ``python`` (None where ``import ray.rllib`` works there)."""
    if not Path(python).is_file():
        return f"no Python at {python}"
    probe = subprocess.run([str(python), "-c", "import ray.rllib"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import ray.rllib failed"])[-1]
        return f"{python} cannot import ray.rllib ({last})"
    return None


LABELS = {RLLIB: "RLlib", RAYSIM: "raysim", RAYSIM_GYM: "raysim, Gymnasium's CartPole-v1 through the adapter"}
RATIO_TARGETS = {"steady": 1.5, "solve": 0.5, "memory": 1.0}  # raysim / RLlib: >= 1.5, <= 0.5, <= 1.0


def median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def label(lines: list[dict]) -> str:
    """A group's side and settings: ``RLlib (aligned)``, ``raysim`` or ``raysim (its overrides)``."""
    first = lines[0]
    settings = ", ".join(first["settings"])
    return f"{LABELS[first['peer']]} ({settings})" if settings else LABELS[first["peer"]]


def per_seed(lines: list[dict], key: str) -> str:
    return " / ".join(number(line.get(key)) for line in sorted(lines, key=lambda line: line["seed"]))


def memory_peak(line: dict) -> float | None:
    return (line.get("memory") or {}).get("pss_peak_mib")


def successes(lines: list[dict]) -> str:
    from raysim.evaluation import wilson

    cells = []
    for line in sorted(lines, key=lambda line: line["seed"]):
        k, n = line.get("eval_successes"), line.get("eval_episodes")
        cells.append("-" if k is None or not n else f"{k}/{n} ({wilson(k, n)[0]:.3f})")
    return ", ".join(cells)


def solve_median(lines: list[dict], key: str) -> str:
    """The median over seeds, an unsolved seed counting as longer than any solved one."""
    values = sorted((line[key] if line.get("solved") else float("inf")) for line in lines)
    middle = statistics.median(values)
    return "not solved" if middle == float("inf") else number(middle, 0 if key == "solve_env_steps" else 2)


def values(group: list[dict], key: str) -> list:
    return [line.get(key) for line in group]


def common():
    """The columns every row has, around the row's own: side, env, seeds ... steady env steps/s, start-up, memory."""
    return (
        [("side", label), ("env", lambda g: g[0]["env"]), ("seeds", lambda g: ",".join(map(str, values(g, "seed"))))],
        [
            ("steady env steps/s, median", lambda g: number(median(values(g, "steady_steps_per_s")))),
            ("Ray start-up s, median", lambda g: number(median(values(g, "startup_seconds")), 1)),
            ("memory: summed PSS peak MiB, median", lambda g: number(median([memory_peak(line) for line in g]))),
        ],
    )


def columns(row: str) -> list[tuple[str, Any]]:
    """The table's columns for ``row``: (title, cell of a group of runs)."""
    head, tail = common()
    training = ("training s to the budget, median", lambda g: number(median(values(g, "train_seconds")), 1))
    own = {
        "cartpole": [
            ("solved", lambda g: f"{sum(map(bool, values(g, 'solved')))}/{len(g)}"),
            ("env steps to solve, per seed", lambda g: per_seed(g, "solve_env_steps")),
            ("median env steps to solve", lambda g: solve_median(g, "solve_env_steps")),
            ("median training s to solve", lambda g: solve_median(g, "solve_seconds")),
            ("final evaluation, median", lambda g: number(median(values(g, "eval_mean")), 1)),
        ],
        "hopper": [
            training,
            ("final evaluation, mean +- std over seeds", lambda g: mean_std(values(g, "eval_mean"))),
            ("training return (last 10 episodes)", lambda g: mean_std(values(g, "training_return"))),
        ],
        "reach": [
            training,
            ("evaluation successes k/n (Wilson 95% lower)", successes),
            ("final evaluation return, median", lambda g: number(median(values(g, "eval_mean")), 1)),
        ],
        "scale": [("shards / env runners", lambda g: str(g[0]["shards"])), training],
    }[row]
    return head + own + tail


def groups(lines: list[dict]) -> dict[tuple, list[dict]]:
    """The runs of one row by side, settings and shards: RLlib first, then raysim, by shard count."""
    found: dict[tuple, list[dict]] = {}
    for line in lines:
        found.setdefault((PEERS.index(line["peer"]), tuple(line["settings"]), line["shards"]), []).append(line)
    return {key: sorted(found[key], key=lambda line: line["seed"]) for key in sorted(found)}


def ratio_line(name: str, ours: float | None, theirs: float | None, target: float, at_least: bool) -> str | None:
    """``name: a / b = r (target >= t: met)``; None where either side has no figure."""
    if ours is None or theirs is None or theirs == 0 or ours == float("inf") or theirs == float("inf"):
        return None
    ratio = ours / theirs
    met = ratio >= target if at_least else ratio <= target
    return f"{name} {ratio:.2f}x (target {'>=' if at_least else '<='} {target:g}x: {'met' if met else 'NOT met'})"


def solve_value(lines: list[dict]) -> float:
    return statistics.median((line["solve_seconds"] if line.get("solved") else float("inf")) for line in lines)


def comparisons(row: str, found: dict[tuple, list[dict]]) -> list[str]:
    """raysim against RLlib, for each raysim group and each RLlib group of the same shard count."""
    from raysim.bench.welch import welch

    bullets = []
    for (peer, _, shards), ours in found.items():
        for (other, _, their_shards), theirs in found.items():
            if PEERS[peer] == RLLIB or PEERS[other] != RLLIB or shards != their_shards:
                continue
            parts = [
                ratio_line(
                    "steady env steps/s",
                    *[median(values(g, "steady_steps_per_s")) for g in (ours, theirs)],
                    RATIO_TARGETS["steady"],
                    True,
                ),
                ratio_line(
                    "memory (summed PSS peak)",
                    *[median([memory_peak(x) for x in g]) for g in (ours, theirs)],
                    RATIO_TARGETS["memory"],
                    False,
                ),
            ]
            if row == "cartpole":
                parts.append(
                    ratio_line(
                        "median training s to solve",
                        solve_value(ours),
                        solve_value(theirs),
                        RATIO_TARGETS["solve"],
                        False,
                    )
                )
            if row == "hopper" and min(len(ours), len(theirs)) > 1:
                difference = welch(values(ours, "eval_mean"), values(theirs, "eval_mean"))
                verdict = "met" if difference.high >= 0 else "NOT met"
                parts.append(
                    f"final evaluation difference {difference.difference:+,.1f} (Welch 95% "
                    f"{difference.low:+,.1f} to {difference.high:+,.1f}; target: includes 0 or above: {verdict})"
                )
            where = f", {shards} shard(s)" if row == "scale" else ""
            bullets.append(f"- {label(ours)} / {label(theirs)}{where}: " + "; ".join(p for p in parts if p))
    return bullets


def provenance(lines: list[dict]) -> str:
    """When, where, under which load and with which versions a row's runs ran."""
    loads = [line["load_start"][0] for line in lines if line.get("load_start")]
    load_text = f"load {min(loads):.2f}-{max(loads):.2f} at the starts" if loads else "load not recorded"
    sides = []
    for peer in PEERS:
        mine = [line for line in lines if line["peer"] == peer and line.get("versions")]
        if mine:
            v = mine[0]["versions"]
            text = ", ".join(f"{name} {v[name]}" for name in ("ray", "torch", "gymnasium") if v.get(name))
            sides.append(f"{LABELS[peer].split(',')[0]}: {text}")
    hosts = sorted({f"{line['host']} ({line['cpus']} cores)" for line in lines})
    versions = "; ".join(dict.fromkeys(sides))
    return (
        f"{min(line['started'] for line in lines)} to {max(line['finished'] for line in lines)} UTC, "
        f"{', '.join(hosts)}, {load_text}; {versions}"
    )


def table(lines: list[dict]) -> str:
    """The page's tables: one per row with runs, its provenance line above and raysim / RLlib below."""
    parts = []
    for row in ROWS:
        mine = [line for line in lines if line["row"] == row]
        if not mine:
            continue
        found = groups(mine)
        titles = columns(row)
        text = [f"**{ROW_SPECS[row].title}** ({provenance(mine)})", ""]
        text.append("| " + " | ".join(title for title, _ in titles) + " |")
        text.append("|" + "---|" * len(titles))
        text += ["| " + " | ".join(cell(group) for _, cell in titles) + " |" for group in found.values()]
        bullets = comparisons(row, found)
        parts.append("\n".join(text + ([""] + bullets if bullets else [])))
    return "\n\n".join(parts) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench rllib", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="the rows to run (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default: each row's: 5, 3, 1, 1)")
    parser.add_argument("--steps", type=int, help="env steps of every run (default: each row's budget)")
    parser.add_argument("--shards", type=int, nargs="+", help=f"the scale row's shard counts (default {SCALE_SHARDS})")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="the sides to run")
    parser.add_argument(
        "--rllib-python",
        type=Path,
        default=Path(os.environ.get("RAYSIM_RLLIB_PYTHON", RLLIB_PYTHON)),
        help=f"RLlib's Python (default $RAYSIM_RLLIB_PYTHON, else {RLLIB_PYTHON})",
    )
    parser.add_argument(
        "--rllib-settings",
        choices=("aligned", "tuned"),
        default="aligned",
        help="RLlib with raysim's values for the aligned keys, or its example's own",
    )
    parser.add_argument("--override", action="append", default=[], help="raysim config override, repeatable")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the steady env steps/s")
    parser.add_argument("--memory-every", type=float, default=1.0, help="seconds between memory readings")
    parser.add_argument(
        "--local",
        action="store_true",
        help="raysim's runs in this process, backend local, no memory figures (a smoke run)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results/rllib"), help=f"results folder (the recorded runs: {RECORDED})"
    )
    parser.add_argument("--table", action="store_true", help="run nothing: print the tables of the results")
    parser.add_argument("--one", choices=(RAYSIM, RAYSIM_GYM), help="one raysim run here: its JSON line on stdout")
    args = parser.parse_args(argv)
    if args.local and RLLIB in args.peers:
        parser.error("--local runs raysim's side only: add --peers raysim raysim-gym")
    if min([*(args.seeds or [1]), *(args.shards or [1]), args.steps or 1]) < 1 or args.warmup < 0:
        parser.error("--seeds, --shards and --steps must be >= 1, --warmup >= 0")
    return args


def one(args: argparse.Namespace) -> int:
    """``--one``: the run of the first row, seed and shard count given, in this process; its JSON line."""
    row = ROW_SPECS[args.rows[0]]
    shards = (args.shards or [0])[0]
    seed = (args.seeds or row.seeds)[0]
    run = Run(row.name, args.one, seed, budget(row, shards or 1, args), shards, tuple(args.override))
    print(json.dumps({"event": "result", **run_raysim(row, run, args)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one:
        return one(args)
    path = args.out / RESULTS
    if not args.table:
        problem = rllib_problem(args.rllib_python) if RLLIB in args.peers else None
        if problem:
            print(
                f"raysim bench rllib: {problem}; create RLlib's environment with `python3 -m venv .venv-rllib && "
                ".venv-rllib/bin/pip install -r benchmarks/rllib/requirements.txt`, give --rllib-python, or run "
                "--peers raysim raysim-gym",
                file=sys.stderr,
            )
            return 2
        code = measure(args)
        if code:
            return code
    lines = read_results(path)  # every row's: the page's tables
    if not lines:
        print(f"raysim bench rllib: no results in {path} (the recorded ones: --out {RECORDED})", file=sys.stderr)
        return 2
    text = table(lines)
    (args.out / TABLE).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
