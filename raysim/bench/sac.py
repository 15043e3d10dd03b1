"""SAC beside CleanRL's ``sac_continuous_action``: returns, wall-clock, the update's cost, and RLPD on pick-place.

Rows (``--rows``, all by default):

- ``hopper``: Hopper-v5, seeds 1-3 at 50k env steps: raysim's ``hopper_sac`` and the peer
  ``benchmarks/cleanrl_sac_continuous.py`` (CleanRL's settings), both evaluated deterministically every 10k env steps
  on the same number of episodes (``hopper_sac``'s ``eval.episodes``, or ``--eval-episodes``), evaluation time
  excluded. Each run records its final evaluation, the mean return of its last 10 training episodes, its training
  seconds split into collection and updates (raysim: the sums of ``time_collect`` and ``time_update`` over its
  metrics rows, one per iteration; the peer: its ``collect_seconds`` and ``update_seconds``), gradient steps/s and
  env steps/s; the table gives the Welch 95% interval of raysim minus the peer.
- ``wallclock``: one seed each at 100k env steps, evaluated at the end only: training seconds to the same env steps
  (start-up apart), the split, gradient steps/s; raysim / peer.
- ``update-cost``: gradient steps/s at batch 256 with 2 and with 10 critics (10: the target the min over a random 2,
  the actor on their mean, RLPD's), in this process, the variants taking turns round after round: raysim's
  ``SAC.gradient_step`` on a ``Learner`` of ``hopper_sac`` whose buffer is full of random transitions of Hopper's
  shapes, the same with the critics as a loop of ``nn.Sequential`` (``QLoop``), and the peer's ``--update-cost``.
- ``rlpd``: Meta-World pick-place-v3, ``--rlpd-config`` with ``algo.demonstrations`` the 5 expert episodes of
  ``raysim bench finetune``'s seed (its evaluation seed, so the same goals and starts), recorded on the config's env
  (its reward and episode ends) into ``<out>/datasets`` unless ``MINARI_DATASETS_PATH`` says where they are; with
  ``--rlpd-bc`` (the default) the actor starts from BC on them (the config's model, in ``<out>/bc/s<seed>``); seeds
  1-3, evaluated every 25k env steps up to 150k; beside it the same config without demonstrations and without BC
  (seed 1) and GRPO fine-tuned from BC-5 (``raysim bench finetune``'s recorded runs).

The peer trains on the env id, learning starts, batch size and buffer capacity of raysim's config (``hopper_sac``'s
are CleanRL's own), so an ``--override`` of those reaches both sides. Every run but the update cost's is a fresh
process (``--one``; ``--local``: this process, raysim's backend local, a smoke run), the sides in turn, who goes
first rotating from seed to seed. Each finished run is appended to ``results.jsonl`` in ``--out`` at once (the
repository's recorded runs: ``benchmarks/results/sac``), so a stopped invocation loses only the run under way and
the next one runs only what is missing. ``--table`` runs nothing: it prints the tables of the results and writes
them to ``sac.md`` there (docs/benchmarks/sac.md copies them).

``raysim bench sac [--rows ...] [--seeds ...] [--steps N] [--sides ...] [--rlpd-config NAME] [--out DIR] [--table]``;
needs ``pip install "raysim[mujoco]"`` (the rlpd row: ``"raysim[metaworld,demos]"``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from raysim.bench.peers import MISSING, SOURCE_BENCHMARKS, peer_module
from raysim.bench.results import installed_version, load, machine, mean_std, now, read_results
from raysim.bench.rllib import RunFailed, run_process
from raysim.models.networks import ACTIVATIONS

if TYPE_CHECKING:
    from raysim.algos.replay import ReplayBuffer
    from raysim.config import Config
    from raysim.learner.learner import Learner

RAYSIM, CLEANRL, NO_DEMOS, LOOP, ALL = "raysim", "cleanrl", "raysim-no-demos", "raysim-loop", "all"
SIDES = (RAYSIM, CLEANRL, NO_DEMOS)
VARIANTS = (RAYSIM, LOOP, CLEANRL)  # the update-cost row's
HOPPER, WALLCLOCK, UPDATE_COST, RLPD = "hopper", "wallclock", "update-cost", "rlpd"
ROWS = (HOPPER, WALLCLOCK, UPDATE_COST, RLPD)
CONFIG, RLPD_CONFIG, PEER = "hopper_sac", "metaworld_pick_place_rlpd", "cleanrl_sac_continuous"
CRITICS = (2, 10)  # the update-cost row's ensembles; the target is the min over 2 of them
TARGET_SUCCESS = 0.8  # the RLPD target: deterministic success within the row's budget, every seed
RECORDED = Path("benchmarks/results/sac")  # the repository's recorded runs, relative to a checkout's root
FINETUNE_RESULTS = SOURCE_BENCHMARKS / "results" / "finetune.jsonl"  # GRPO fine-tuned from BC-5, per seed
RESULTS, TABLE = "results.jsonl", "sac.md"
VERSIONS = ("ray", "torch", "gymnasium", "mujoco", "metaworld", "numpy")
LABELS = {
    RAYSIM: "raysim",
    CLEANRL: "CleanRL sac_continuous_action",
    NO_DEMOS: "raysim, no demonstrations",
    LOOP: "raysim, critics as a loop (QLoop)",
}


@dataclass(frozen=True)
class Row:
    """A row: its sides, seeds, env steps and evaluation interval (0: the final evaluation only); the sides in
    ``first_seed_only`` run the first seed alone."""

    name: str
    title: str
    sides: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    eval_every: int
    first_seed_only: tuple[str, ...] = ()


ROW_SPECS = {
    HOPPER: Row(HOPPER, "Hopper-v5: returns", (RAYSIM, CLEANRL), (1, 2, 3), 50_000, 10_000),
    WALLCLOCK: Row(WALLCLOCK, "Hopper-v5: wall-clock to the same env steps", (RAYSIM, CLEANRL), (1,), 100_000, 0),
    UPDATE_COST: Row(UPDATE_COST, "Update cost: gradient steps/s at batch 256, [256, 256]", VARIANTS, (1,), 0, 0),
    RLPD: Row(
        RLPD, "Meta-World pick-place-v3: RLPD from 5 expert demonstrations", (RAYSIM, NO_DEMOS), (1, 2, 3), 150_000,
        25_000, first_seed_only=(NO_DEMOS,),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One run of one side: ``row``'s task with ``config`` (the peer: its env id and aligned keys), ``steps`` env
    steps (the update cost: timed gradient steps per variant and round), evaluated every ``eval_every`` env steps
    on ``eval_episodes`` episodes; ``settings``: raysim's config overrides beyond the row's; ``demonstrations``: the
    rlpd row's dataset ('': none; None: another row)."""

    row: str
    side: str
    config: str
    seed: int
    steps: int
    eval_every: int
    eval_episodes: int
    settings: tuple[str, ...]
    demonstrations: str | None = None
    pretrained: str | None = None  # the rlpd row's BC run on the same demonstrations the actor starts from

    def key(self) -> tuple:
        fields = (self.row, self.side, self.config, self.seed, self.steps, self.eval_episodes, self.settings)
        return (*fields, self.demonstrations, self.pretrained)

    def overrides(self) -> tuple[str, ...]:
        """raysim's config overrides of the run: its settings, its demonstrations and the actor it starts from."""
        demonstrations = () if self.demonstrations is None else (f"algo.demonstrations={self.demonstrations!r}",)
        pretrained = () if self.pretrained is None else (f"model.init_from={self.pretrained}",)
        return (*self.settings, *demonstrations, *pretrained)


def line_key(line: dict) -> tuple:
    """The ``Run.key`` of a results line."""
    fields = ("row", "side", "config", "seed", "steps", "eval_episodes")
    return (*(line[f] for f in fields), tuple(line["settings"]), line.get("demonstrations"), line.get("pretrained"))


# -- the critics as a loop: the baseline of the batched ensemble ----------------------------------------------------


class QLoop(nn.Module):
    """The critics of ``raysim.models.QEnsemble`` as separate ``nn.Linear`` stacks evaluated one after another: the
    baseline the batched ensemble is measured against; the same function, ``[critics, B]``."""

    def __init__(self, critics: int, in_dim: int, hidden_sizes: list[int], activation: str, layer_norm: bool):
        super().__init__()
        sizes = [in_dim, *hidden_sizes, 1]
        nets = []
        for _ in range(critics):
            layers: list[nn.Module] = []
            for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
                layers.append(nn.Linear(fan_in, fan_out))
                if fan_out != 1:
                    layers += [nn.LayerNorm(fan_out)] if layer_norm else []
                    layers.append(ACTIVATIONS[activation]())
            nets.append(nn.Sequential(*layers))
        self.nets = nn.ModuleList(nets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([net(x).squeeze(-1) for net in self.nets])


# -- the runs ---------------------------------------------------------------------------------------------------------


def packaged(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A config by name or path with ``overrides``."""
    import raysim

    return raysim.load_config(name, list(overrides))


def row_config(row: str, args: argparse.Namespace) -> str:
    return args.rlpd_config if row == RLPD else CONFIG


def settings_of(side: str, args: argparse.Namespace) -> tuple[str, ...]:
    """A run's settings: ``--override``, and ``backend=local`` for raysim with ``--local`` (apart from its runs on
    Ray)."""
    return (*args.override, *(("backend=local",) if args.local and side != CLEANRL else ()))


def demonstrations_of(row: str, side: str, seed: int, args: argparse.Namespace) -> str | None:
    """The rlpd row's dataset: the expert's episodes of ``raysim bench finetune`` for the seed (its seed, so the same
    goals and starts), recorded on the rlpd config's env (its reward); none without."""
    if row != RLPD:
        return None
    return f"raysim/pick-place-v3/expert-{args.demos}-s{seed}-rlpd-v0" if side == RAYSIM else ""


def pretrained_of(row: str, side: str, seed: int, args: argparse.Namespace) -> str | None:
    """Where the rlpd row's actor starts (``--rlpd-bc``): BC on the seed's demonstrations with the config's model."""
    return str(args.out / "bc" / f"s{seed}") if row == RLPD and side == RAYSIM and args.rlpd_bc else None


def planned(args: argparse.Namespace) -> list[Run]:
    """Every run of the chosen rows, seeds and sides; per seed the sides in an order that rotates from one seed to
    the next, so that neither side always runs first. The update cost is one run (its variants take turns in it)."""
    runs = []
    for name in args.rows:
        row, turn = ROW_SPECS[name], 0  # each row's first seed: its sides in their order (raysim first)
        config = row_config(name, args)
        if name == UPDATE_COST:
            settings = (*args.override, f"rounds={args.cost_rounds}", f"warmup={args.cost_warmup}")
            runs.append(Run(name, ALL, config, 1, args.cost_steps, 0, 0, (*settings, f"buffer={args.cost_buffer}")))
            continue
        episodes = args.eval_episodes or packaged(config, args.override).eval.episodes
        every = row.eval_every if args.eval_every is None else args.eval_every
        seeds = args.seeds or row.seeds
        for seed in seeds:
            sides = [s for s in row.sides if s in args.sides and (seed == seeds[0] or s not in row.first_seed_only)]
            shift = turn % max(1, len(sides))
            for side in sides[shift:] + sides[:shift]:
                starts = demonstrations_of(name, side, seed, args), pretrained_of(name, side, seed, args)
                steps = args.steps or row.steps
                runs.append(Run(name, side, config, seed, steps, every, episodes, settings_of(side, args), *starts))
            turn += 1
    return runs


def phase_sums(rows: list[dict]) -> dict[str, float]:
    """Seconds of collection, updates and checkpoints over a run: each metrics row holds the mean per iteration
    since the row before, so it counts for the iterations between them."""
    sums = {"collect_seconds": 0.0, "update_seconds": 0.0, "checkpoint_seconds": 0.0}
    before = 0
    for row in rows:
        iterations, before = row["iteration"] - before, row["iteration"]
        for key, phase in zip(sums, ("time_collect", "time_update", "time_checkpoint"), strict=True):
            sums[key] += row.get(phase, 0.0) * iterations
    return sums


def gradient_steps(rows: list[dict]) -> int:
    """The gradient steps of a run: each row's replay ratio times the env steps collected since the row before."""
    total, before = 0, 0
    for row in rows:
        total += round(row.get("replay_ratio", 0.0) * (row["env_steps"] - before))
        before = row["env_steps"]
    return total


def evaluation_figures(returns: list[float], successes: int | None) -> dict[str, Any]:
    return {
        "eval_episodes": len(returns),
        "eval_mean": statistics.fmean(returns) if returns else None,
        "eval_std": statistics.pstdev(returns) if returns else None,
        "eval_successes": successes,
    }


def run_raysim(run: Run) -> dict[str, Any]:
    """One raysim run in this process (a fresh embedded Ray unless its settings say ``backend=local``): its figures
    from the run's summary and its metrics rows (one per iteration)."""
    import raysim
    from raysim.bench.mujoco import last_episodes_return
    from raysim.records import read_metrics
    from raysim.storage import open_storage

    with tempfile.TemporaryDirectory(prefix="raysim-bench-sac-") as folder:
        logging = ["train.log_every=1", "train.sinks=[parquet]", f"run_dir={folder}/run"]
        row = [f"seed={run.seed}", f"train.total_steps={run.steps}", f"eval.every_steps={run.eval_every}"]
        config = packaged(run.config, [*row, f"eval.episodes={run.eval_episodes}", *logging, *run.overrides()])
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result line alone
            summary = raysim.Trainer(config).train()
        rows = read_metrics(open_storage(f"{folder}/run"))
    report = summary.evaluation
    if report is None:
        raise RunFailed(f"raysim's run stopped ({summary.stopped_by}) before its final evaluation")
    evals = [[int(r["env_steps"]), r["eval_return"], r.get("eval_success_rate")] for r in rows if "eval_return" in r]
    rate = report.success_rate
    evals.append([summary.env_steps, report.mean_return, rate.value if rate is not None else None])
    times, steps = phase_sums(rows), gradient_steps(rows)
    episodes = [(int(r["env_steps"]), r["episode_return"], int(r["episodes"])) for r in rows if r.get("episodes")]
    return {
        "env": config.env.id,
        "env_steps": summary.env_steps,
        "iterations": summary.iterations,
        "startup_seconds": summary.startup_time,
        "train_seconds": summary.wall_time,
        **times,
        "gradient_steps": steps,
        "updates_per_s": steps / times["update_seconds"] if steps else None,
        "env_steps_per_s": summary.env_steps / summary.wall_time,
        **evaluation_figures([r["return"] for r in report.records], rate.numerator if rate is not None else None),
        "evals": evals,
        "training_return": last_episodes_return(episodes),
    }


def peer() -> ModuleType:
    """The peer's module, or a RunFailed naming why it is missing."""
    module = peer_module(PEER)
    if module is None:
        raise RunFailed(MISSING)
    return module


@contextlib.contextmanager
def own_threads():
    """torch's thread count put back afterwards (the peer sets one thread for its process)."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_cleanrl(run: Run) -> dict[str, Any]:
    """One run of the peer in this process on the env id, learning starts, batch size and buffer capacity of raysim's
    config with the run's overrides; its JSON lines go to stderr."""
    config = packaged(run.config, [o for o in run.settings if not o.startswith("backend=")])
    aligned = {"learning_starts": config.algo.learning_starts, "batch_size": config.algo.batch_size}
    env_id = config.env.id.removeprefix("gym:")
    with own_threads(), contextlib.redirect_stdout(sys.stderr):
        records = peer().train(
            env_id,
            run.seed,
            run.steps,
            run.eval_every,
            run.eval_episodes,
            buffer_size=config.replay.capacity,
            **aligned,
        )
    end = records[-1]
    return {
        "env": env_id,
        "env_steps": end["env_steps"],
        "iterations": None,
        "startup_seconds": None,
        "train_seconds": end["train_seconds"],
        "collect_seconds": end["collect_seconds"],
        "update_seconds": end["update_seconds"],
        "checkpoint_seconds": 0.0,
        "gradient_steps": end["updates"],
        "updates_per_s": end["updates_per_s"],
        "env_steps_per_s": end["env_steps_per_s"],
        **evaluation_figures(end["eval_returns"], None),
        "eval_mean": end["eval_return_mean"],  # of the unrounded returns
        "evals": [[r["env_steps"], r["eval_return_mean"], None] for r in records if r["event"] == "eval"],
        "training_return": end["train_return_last10"],
        **aligned,
    }


RUNNERS = {RAYSIM: run_raysim, NO_DEMOS: run_raysim, CLEANRL: run_cleanrl}


def one_command(run: Run) -> list[str]:
    """A run in a fresh Python of this environment (``--one``)."""
    command = [sys.executable, "-m", "raysim.bench.sac", "--one", run.side, "--rows", run.row]
    command += ["--seeds", str(run.seed), "--steps", str(run.steps), "--eval-every", str(run.eval_every)]
    command += ["--eval-episodes", str(run.eval_episodes), "--rlpd-config", run.config]
    return command + [f"--override={override}" for override in run.overrides()]


def record(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """Measure one run (a fresh process, or this one with ``--local``; the update cost: this one) and return its
    results line."""
    started, load_start, begin = now(), load(), time.perf_counter()
    memory = None
    if run.row == RLPD and run.side == RAYSIM:  # recorded once, here: the run's process finds them
        prepare_rlpd(run, args)
    if run.row == UPDATE_COST:
        result = update_cost(run, args)
    elif args.local:
        result = RUNNERS[run.side](run)
    else:
        result, memory = run_process(one_command(run), 1.0)
        result.pop("event")
    return {
        "bench": "sac",
        "row": run.row,
        "side": run.side,
        "config": run.config,
        "seed": run.seed,
        "steps": run.steps,
        "eval_every": run.eval_every,
        "eval_episodes": run.eval_episodes,
        "settings": list(run.settings),
        "demonstrations": run.demonstrations,
        "pretrained": run.pretrained,
        **({"demo_episodes": args.demos} if run.demonstrations else {}),
        **result,
        "process_seconds": time.perf_counter() - begin,  # the whole run: imports, evaluations, shutdown too
        "memory": memory,
        "versions": {name: installed_version(name) for name in VERSIONS},
        **machine(),
        "started": started,
        "finished": now(),
        "load_start": load_start,
        "load_end": load(),
    }


def prepare_rlpd(run: Run, args: argparse.Namespace) -> None:
    """The rlpd run's demonstrations (the expert's episodes of ``raysim bench finetune``'s seed, recorded on the
    run's env) and, with ``--rlpd-bc``, the BC run its actor starts from (the config's model, evaluated on the
    run's episode count), each made once."""
    import raysim
    from raysim.bench.finetune import BC_CONFIG
    from raysim.coordinator.demonstrations import record_demonstrations
    from raysim.demos.dataset import locate_dataset

    try:
        locate_dataset(run.demonstrations)
    except Exception:  # noqa: BLE001 - not recorded yet
        print(f"[recording {args.demos} expert episodes: {run.demonstrations}]", file=sys.stderr, flush=True)
        overrides = list(run.settings)
        record_demonstrations(
            run.demonstrations,
            args.demos,
            config=run.config,
            policy="expert",
            seed=1000 + run.seed,
            overrides=overrides,
            backend="local",
        )
    if run.pretrained is None or Path(run.pretrained, "checkpoints").exists():
        return
    model = packaged(run.config, run.settings).model
    keys = ("hidden_sizes", "activation", "action_transform", "log_std", "init_log_std")
    overrides = [f"model.{key}={json.dumps(getattr(model, key))}" for key in keys]
    overrides += [f"algo.dataset={run.demonstrations}", f"seed={run.seed}", f"eval.episodes={run.eval_episodes}"]
    overrides += ["backend=local"]
    overrides += [f"algo.updates={args.bc_updates}"] if args.bc_updates else []
    print(f"[BC on {run.demonstrations}: {run.pretrained}]", file=sys.stderr, flush=True)
    raysim.Trainer(raysim.load_config(BC_CONFIG, [*overrides, f"run_dir={run.pretrained}"])).train()


def measure(args: argparse.Namespace, runs: list[Run]) -> int:
    """Every run not yet in ``results.jsonl``, each appended as it ends; 1 at the first that fails (those before it
    are kept). SIGTERM ends the run under way."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / RESULTS
    done = {line_key(line) for line in read_results(path)}
    stopping = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        for run in runs:
            if run.key() in done:
                continue
            print(f"[{run.row} {run.side} seed {run.seed}: {run.steps:,} steps]", file=sys.stderr, flush=True)
            try:
                line = record(run, args)
            except RunFailed as error:
                print(f"raysim bench sac: {error}", file=sys.stderr)
                return 1
            with open(path, "a") as f:  # at once: a stopped invocation loses only the run under way
                f.write(json.dumps(line) + "\n")
            done.add(run.key())
    finally:
        signal.signal(signal.SIGTERM, stopping)
    return 0


# -- the update cost ---------------------------------------------------------------------------------------------


def cost_config(critics: int, overrides: tuple[str, ...]) -> Config:
    """``hopper_sac`` with ``critics`` critics (more than 2: the target the min over a random 2, the actor on their
    mean, as the peer's loop does)."""
    ensemble = ["algo.critic_subset=2", "algo.actor_q=mean"] if critics > 2 else []
    return packaged(CONFIG, [f"algo.critics={critics}", *ensemble, *overrides])


def cost_learner(critics: int, loop: bool, overrides: tuple[str, ...]) -> Learner:
    """A ``Learner`` of ``hopper_sac`` built in this process, its critics batched or (``loop``) a ``QLoop``; its
    replay buffer is set by the caller."""
    from unittest import mock

    import raysim.algos.sac
    from raysim.coordinator.preflight import check_env_and_model
    from raysim.learner.learner import Learner

    config = cost_config(critics, overrides)
    spaces = check_env_and_model(config)
    swap = mock.patch.object(raysim.algos.sac, "QEnsemble", QLoop) if loop else contextlib.nullcontext()
    with swap:
        return Learner(*spaces, config.model, config.algo, horizon=1, seed=config.seed, replay_capacity=1)


def random_transitions(learner: Learner, count: int, generator: torch.Generator) -> dict[str, Any]:
    """``count`` random transitions of the learner's observation groups and action shape, 1% of them terminal."""
    algorithm, model = learner.algorithm, learner.model
    spaces = model.observation_spaces

    def observations() -> dict[str, torch.Tensor]:
        return {g: torch.randn((count, *spaces[g].shape), generator=generator) for g in algorithm.groups_read()}

    return {
        "obs": observations(),
        "next_obs": observations(),
        "actions": torch.randn((count, *model.action_space.shape), generator=generator),
        "reward": torch.randn(count, generator=generator),
        "terminated": torch.rand(count, generator=generator) < 0.01,
    }


def raysim_timer(
    critics: int, loop: bool, run: Run, args: argparse.Namespace, replay: ReplayBuffer
) -> Callable[[], float]:
    """A function timing ``run.steps`` gradient steps of raysim's update on the shared full ``replay`` buffer, after
    ``--cost-warmup`` untimed ones."""
    learner = cost_learner(critics, loop, config_overrides(run))
    if replay.size == 0:
        replay.add(random_transitions(learner, replay.capacity, torch.Generator().manual_seed(run.seed)))
    learner.algorithm.use_replay(replay)

    def steps(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            learner.algorithm.gradient_step(learner.step, learner.generator)
        return time.perf_counter() - start

    steps(args.cost_warmup)
    return lambda: steps(run.steps)


def cleanrl_timer(critics: int, run: Run, args: argparse.Namespace) -> Callable[[], float]:
    """A function timing ``run.steps`` steps of the peer's ``--update-cost`` (each call builds its SAC afresh and
    warms it up untimed)."""
    module, config = peer(), cost_config(critics, config_overrides(run))
    env_id, batch = config.env.id.removeprefix("gym:"), config.algo.batch_size

    def seconds() -> float:
        with contextlib.redirect_stdout(sys.stderr):
            return module.update_cost(env_id, critics, run.steps, args.cost_warmup, batch, run.seed)["seconds"]

    return seconds


def config_overrides(run: Run) -> tuple[str, ...]:
    """The settings of a run that are config overrides (the update cost's others are its own: ``rounds=5``)."""
    return tuple(o for o in run.settings if "=" in o and "." in o.split("=", 1)[0])


def update_cost(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """Each variant with 2 and with 10 critics, ``--cost-rounds`` rounds of ``run.steps`` timed gradient steps each,
    the variants taking turns in an order that rotates from round to round; one torch thread."""
    from raysim.algos.replay import ReplayBuffer

    replay = ReplayBuffer(args.cost_buffer)
    with own_threads():
        torch.set_num_threads(1)
        timers = {}
        for critics in CRITICS:
            timers[(RAYSIM, critics)] = raysim_timer(critics, False, run, args, replay)
            timers[(LOOP, critics)] = raysim_timer(critics, True, run, args, replay)
            if CLEANRL in args.sides:
                timers[(CLEANRL, critics)] = cleanrl_timer(critics, run, args)
        seconds: dict[tuple, list[float]] = {key: [] for key in timers}
        keys, loads = list(timers), [load()]
        for round_ in range(args.cost_rounds):
            shift = round_ % len(keys)
            for key in keys[shift:] + keys[:shift]:
                seconds[key].append(timers[key]())
            loads.append(load())
    variants: dict[str, dict[str, Any]] = {}
    for (variant, critics), times in seconds.items():
        total = run.steps * len(times)
        variants.setdefault(variant, {})[str(critics)] = {
            "seconds": times,
            "steps_per_s": total / sum(times),
            "ms_per_step": 1000 * sum(times) / total,
        }
    batch = cost_config(CRITICS[0], config_overrides(run)).algo.batch_size
    return {"env": "Hopper-v5 shapes", "batch_size": batch, "torch_threads": 1, "variants": variants, "loads": loads}


# -- the tables ---------------------------------------------------------------------------------------------------


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def per_seed(lines: list[dict], key: str, digits: int = 1) -> str:
    return " / ".join(number(line.get(key), digits) for line in lines)


def mean_of(lines: list[dict], key: str) -> float | None:
    values = [line[key] for line in lines if line.get(key) is not None]
    return statistics.fmean(values) if values else None


def label(lines: list[dict]) -> str:
    """A group's side and settings: ``CleanRL (...)``, ``raysim`` or ``raysim (its overrides)``."""
    first = lines[0]
    settings = ", ".join(first["settings"])
    return f"{LABELS[first['side']]} ({settings})" if settings else LABELS[first["side"]]


def groups(lines: list[dict]) -> dict[tuple, list[dict]]:
    """A row's runs by side, settings, budget and evaluation, each group in seed order."""
    found: dict[tuple, list[dict]] = {}
    for line in lines:
        key = (SIDES.index(line["side"]), line["steps"], line["eval_episodes"], tuple(line["settings"]))
        key += (line.get("demo_episodes") or 0,)
        found.setdefault(key, []).append(line)
    return {key: sorted(found[key], key=lambda line: line["seed"]) for key in sorted(found)}


def provenance(lines: list[dict]) -> str:
    """When, where, under which load and with which versions a row's runs ran."""
    loads = [line["load_start"][0] for line in lines if line.get("load_start")]
    load_text = f"load {min(loads):.2f}-{max(loads):.2f} at the starts" if loads else "load not recorded"
    hosts = sorted({f"{line['host']} ({line['cpus']} cores)" for line in lines})
    v = lines[0].get("versions") or {}
    versions = ", ".join(f"{name} {v[name]}" for name in ("torch", "gymnasium", "mujoco", "metaworld") if v.get(name))
    return (
        f"{min(line['started'] for line in lines)} to {max(line['finished'] for line in lines)} UTC, "
        f"{', '.join(hosts)}, {load_text}; {versions}"
    )


def split(line: dict) -> str:
    """Training seconds as collection + updates (+ the rest: raysim's checkpoints and bookkeeping)."""
    collect, update, total = line["collect_seconds"], line["update_seconds"], line["train_seconds"]
    rest = total - collect - update
    return f"{total:,.1f} = {collect:,.1f} + {update:,.1f}" + (f" + {rest:,.1f}" if round(rest, 1) else "")


def hopper_table(lines: list[dict]) -> list[str]:
    """Per side: each seed's final evaluation and last training episodes, their mean +- std, the time split."""
    text = [
        "| side | env steps | seeds | final deterministic evaluation, per seed | mean +- std "
        "| last 10 training episodes, per seed | mean +- std | training s = collection + updates (+ rest), "
        "per seed | gradient steps/s, mean | env steps/s, mean |",
        "|" + "---|" * 10,
    ]
    for group in groups(lines).values():
        seeds = ",".join(str(line["seed"]) for line in group)
        text.append(
            f"| {label(group)} | {group[0]['env_steps']:,} | {seeds} | {per_seed(group, 'eval_mean')} "
            f"| {mean_std([line['eval_mean'] for line in group])} | {per_seed(group, 'training_return')} "
            f"| {mean_std([line['training_return'] for line in group])} | {' / '.join(map(split, group))} "
            f"| {number(mean_of(group, 'updates_per_s'), 1)} | {number(mean_of(group, 'env_steps_per_s'), 1)} |"
        )
    return text + [""] + hopper_comparisons(groups(lines))


def pairs(found: dict[tuple, list[dict]], other: str) -> list[tuple[list[dict], list[dict]]]:
    """Each raysim group with the ``other`` side's group of the same budget and evaluation episodes."""
    out = []
    for (side, steps, episodes, *_), ours in found.items():
        for (their_side, their_steps, their_episodes, *_), theirs in found.items():
            if (
                SIDES[side] == RAYSIM
                and SIDES[their_side] == other
                and (steps, episodes) == (their_steps, their_episodes)
            ):
                out.append((ours, theirs))
    return out


def hopper_comparisons(found: dict[tuple, list[dict]]) -> list[str]:
    """raysim minus the peer, with Welch's 95% interval (the issue's target: it includes 0 or lies above)."""
    from raysim.bench.welch import welch

    bullets = []
    for ours, theirs in pairs(found, CLEANRL):
        parts = []
        for key, name in (("eval_mean", "final evaluation"), ("training_return", "last 10 training episodes")):
            a, b = ([line[key] for line in g if line.get(key) is not None] for g in (ours, theirs))
            if min(len(a), len(b)) < 2:
                continue
            d = welch(a, b)
            verdict = "met" if d.high >= 0 else "NOT met"
            parts.append(
                f"{name} {d.difference:+,.1f} (Welch 95% {d.low:+,.1f} to {d.high:+,.1f}; target: includes 0 or "
                f"above: {verdict})"
            )
        if parts:
            bullets.append(f"- {label(ours)} - {label(theirs)}: " + "; ".join(parts))
    return bullets


def wallclock_table(lines: list[dict]) -> list[str]:
    text = [
        "| side | seed | env steps | training s | collection s | updates s | rest s | gradient steps/s "
        "| env steps/s | start-up s |",
        "|" + "---|" * 10,
    ]
    for group in groups(lines).values():
        for line in group:
            total = line["train_seconds"]
            shares = [f"{line[k]:,.1f} ({100 * line[k] / total:.0f}%)" for k in ("collect_seconds", "update_seconds")]
            rest = total - line["collect_seconds"] - line["update_seconds"]
            text.append(
                f"| {label(group)} | {line['seed']} | {line['env_steps']:,} | {total:,.1f} | {' | '.join(shares)} "
                f"| {rest:,.1f} | {number(line['updates_per_s'], 1)} | {number(line['env_steps_per_s'], 1)} "
                f"| {number(line['startup_seconds'], 1)} |"
            )
    bullets = []
    for ours, theirs in pairs(groups(lines), CLEANRL):
        per_step = [statistics.fmean(x["train_seconds"] / x["env_steps"] for x in g) for g in (ours, theirs)]
        ratio = per_step[0] / per_step[1]
        updates = (mean_of(ours, "updates_per_s") or 0) / (mean_of(theirs, "updates_per_s") or 1)
        verdict = "met" if ratio <= 1 else "NOT met"
        bullets.append(
            f"- {label(ours)} / {label(theirs)}: training seconds per env step {ratio:.2f}x (target <= 1x, no "
            f"slower: {verdict}); gradient steps/s {updates:.2f}x"
        )
    return text + ([""] + bullets if bullets else [])


def update_cost_table(lines: list[dict]) -> list[str]:
    """Per variant: steps/s and ms per step with 2 and with 10 critics, and the 10/2 ratio of the cost."""
    text = []
    for line in lines:
        loads = [x[0] for x in line["loads"] if x]
        text += [
            f"{len(line['loads']) - 1} rounds x {line['steps']} gradient steps per variant, batch "
            f"{line['batch_size']}, {line['torch_threads']} torch thread, load {min(loads):.2f}-{max(loads):.2f} "
            f"over the rounds" + (f"; settings: {', '.join(line['settings'])}" if line["settings"] else ""),
            "",
            "| update | 2 critics: steps/s | ms/step | 10 critics: steps/s | ms/step | cost 10 / 2 |",
            "|---|---|---|---|---|---|",
        ]
        for variant in VARIANTS:
            figures = line["variants"].get(variant)
            if not figures:
                continue
            two, ten = figures[str(CRITICS[0])], figures[str(CRITICS[1])]
            text.append(
                f"| {LABELS[variant]} | {two['steps_per_s']:,.1f} | {two['ms_per_step']:,.2f} "
                f"| {ten['steps_per_s']:,.1f} | {ten['ms_per_step']:,.2f} "
                f"| {ten['ms_per_step'] / two['ms_per_step']:.2f}x |"
            )
        text.append("")
    return text[:-1]


def first_reaching(evals: list[list]) -> int | None:
    """The env steps of the first evaluation whose success rate reached the target (None: none did)."""
    return next((int(steps) for steps, _, rate in evals if rate is not None and rate >= TARGET_SUCCESS), None)


def rate_of(line: dict) -> float | None:
    k, n = line.get("eval_successes"), line.get("eval_episodes")
    return k / n if k is not None and n else None


def rlpd_cell(line: dict | None) -> str:
    if line is None:
        return "-"
    if rate_of(line) is None:  # an env without success
        return f"return {number(line['eval_mean'], 1)}"
    reached = first_reaching(line.get("evals") or [])
    where = f"{TARGET_SUCCESS:g} first at {reached:,}" if reached is not None else f"{TARGET_SUCCESS:g} not reached"
    return f"{line['eval_successes']}/{line['eval_episodes']} ({rate_of(line):.2f}); {where}"


def rlpd_table(lines: list[dict], grpo: list[dict]) -> list[str]:
    """One row per method, one column per seed: the final successes, where the target was first reached; GRPO
    fine-tuned from BC-5 (``raysim bench finetune``) beside them; then each run's evaluations."""
    found = groups(lines)
    seeds = sorted({line["seed"] for line in lines} | {line["seed"] for line in grpo})
    text = ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|" + "---|" * (len(seeds) + 1)]
    for group in found.values():
        by_seed = {line["seed"]: line for line in group}
        first = group[0]
        demos = f", {first['demo_episodes']} expert episodes" if first.get("demo_episodes") else ""
        name = f"{label(group)}{demos}, {first['config']}, {first['steps']:,} env steps"
        text.append(f"| {name} | " + " | ".join(rlpd_cell(by_seed.get(s)) for s in seeds) + " |")
    if grpo:
        by_seed = {line["seed"]: line for line in grpo}
        cells = [
            f"{by_seed[s]['eval_successes']}/{by_seed[s]['eval_episodes']} ({rate_of(by_seed[s]):.2f})"
            if s in by_seed
            else "-"
            for s in seeds
        ]
        steps = grpo[0]["steps"]
        text.append(f"| GRPO fine-tuned from BC-5 ({steps:,} env steps; raysim bench finetune) | {' | '.join(cells)} |")
    curves = [
        f"- {label(group)}, seed {line['seed']}: "
        + ", ".join(f"{steps:,}: {'-' if rate is None else f'{rate:.2f}'}" for steps, _, rate in line["evals"])
        for group in found.values()
        for line in group
    ]
    return text + ["", "Deterministic success rate at each evaluation (env steps: rate):", "", *curves]


def rlpd_verdicts(lines: list[dict], grpo: list[dict]) -> list[str]:
    """The issue's targets for the runs with demonstrations: >= 0.8 within the budget on every seed, and above
    GRPO's fine-tuning on every seed."""
    bullets = []
    grpo_rates = {line["seed"]: rate_of(line) for line in grpo}
    for group in groups([line for line in lines if line["side"] == RAYSIM]).values():
        reached = [first_reaching(line["evals"]) is not None for line in group]
        seeds = ", ".join(str(line["seed"]) for line in group)
        text = f"- {label(group)}: success >= {TARGET_SUCCESS:g} within {group[0]['steps']:,} env steps on seeds "
        text += f"{seeds}: {'met' if all(reached) else 'NOT met'}"
        beside = [(rate_of(line), grpo_rates.get(line["seed"])) for line in group]
        if all(theirs is not None for _, theirs in beside):
            above = all(ours > theirs for ours, theirs in beside)
            gains = ", ".join(f"{ours:.2f} vs {theirs:.2f}" for ours, theirs in beside)
            text += f"; above GRPO fine-tuned from BC-5 on every seed ({gains}): {'met' if above else 'NOT met'}"
        bullets.append(text)
    return bullets


def grpo_lines(path: Path) -> list[dict]:
    """GRPO fine-tuned from BC-5, per seed, as ``raysim bench finetune`` recorded it (none where not recorded)."""
    return [line for line in read_results(path) if line.get("row") == "grpo_finetune"]


def table(lines: list[dict], grpo: list[dict]) -> str:
    """The page's tables: one per row with runs, its provenance line above, the comparisons below."""
    parts = []
    for name in ROWS:
        mine = [line for line in lines if line["row"] == name]
        if not mine:
            continue
        head = [f"**{ROW_SPECS[name].title}** ({provenance(mine)})", ""]
        if name == HOPPER:
            body = hopper_table(mine)
        elif name == WALLCLOCK:
            body = wallclock_table(mine)
        elif name == UPDATE_COST:
            body = update_cost_table(mine)
        else:
            body = rlpd_table(mine, grpo) + [""] + rlpd_verdicts(mine, grpo)
        parts.append("\n".join(head + body).rstrip())
    return "\n\n".join(parts) + "\n"


# -- the command ----------------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench sac", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="the rows to run (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default: each row's: 1-3, 1, -, 1-3)")
    parser.add_argument("--steps", type=int, help="env steps of every run (default: each row's: 50k, 100k, 150k)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="the sides to run")
    parser.add_argument("--eval-every", type=int, help="env steps between evaluations (default: each row's)")
    parser.add_argument("--eval-episodes", type=int, help="evaluation episodes of both sides (default: the config's)")
    parser.add_argument("--override", action="append", default=[], help="raysim config override, repeatable")
    parser.add_argument("--rlpd-config", default=RLPD_CONFIG, help=f"the rlpd row's config (default {RLPD_CONFIG})")
    parser.add_argument("--demos", type=int, default=5, help="expert episodes of the rlpd row's demonstrations")
    parser.add_argument(
        "--rlpd-bc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the rlpd row's actor starts from BC on the same demonstrations (model.init_from; default: yes)",
    )
    parser.add_argument("--bc-updates", type=int, help="that BC's gradient steps (default: metaworld_pick_place_bc's)")
    parser.add_argument("--finetune-results", type=Path, default=FINETUNE_RESULTS, help="GRPO's recorded runs")
    parser.add_argument("--cost-steps", type=int, default=200, help="update cost: timed steps per variant and round")
    parser.add_argument("--cost-rounds", type=int, default=5, help="update cost: rounds of every variant in turn")
    parser.add_argument("--cost-warmup", type=int, default=20, help="update cost: untimed steps first")
    parser.add_argument("--cost-buffer", type=int, default=1_000_000, help="update cost: transitions in the buffer")
    parser.add_argument("--local", action="store_true", help="every run in this process, raysim's backend local")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results/sac"), help=f"results folder (the recorded runs: {RECORDED})"
    )
    parser.add_argument("--table", action="store_true", help="run nothing: print the tables of the results")
    parser.add_argument("--one", choices=SIDES, help="one run here: its JSON line on stdout (what a row runs)")
    args = parser.parse_args(argv)
    numbers = [*(args.seeds or [1]), args.steps or 1, args.demos, args.cost_steps, args.cost_rounds, args.cost_buffer]
    if min(numbers) < 1 or args.cost_warmup < 0 or min(args.eval_every or 0, args.eval_episodes or 0) < 0:
        parser.error("--seeds, --steps, --demos and --cost-* must be >= 1 (--cost-warmup, --eval-* >= 0)")
    args.cost_steps += args.cost_steps % 2  # even: every second step holds the actor's and alpha's two steps
    return args


def problem(args: argparse.Namespace) -> str | None:
    """Why the chosen rows cannot start (a config that does not load, an override it refuses), None when they can;
    checked before the first run, which may be hours before the last."""
    from raysim.composition import ConfigError

    for row in args.rows:
        try:
            packaged(row_config(row, args), args.override)
        except ConfigError as error:
            return f"--rlpd-config {args.rlpd_config}: {error}" if row == RLPD else str(error)
    return None


def run_of(args: argparse.Namespace) -> Run:
    """``--one``'s run: side ``--one``, the first row and seed given; ``--override`` all of its config overrides."""
    row = args.rows[0]
    seed, steps = (args.seeds or [1])[0], args.steps or ROW_SPECS[row].steps
    every = ROW_SPECS[row].eval_every if args.eval_every is None else args.eval_every
    return Run(row, args.one, row_config(row, args), seed, steps, every, args.eval_episodes or 0, tuple(args.override))


def one(args: argparse.Namespace) -> int:
    """``--one``: one run in this process; its JSON line on stdout."""
    print(json.dumps({"event": "result", **RUNNERS[args.one](run_of(args))}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one:
        return one(args)
    if not args.table:
        if peer_module(PEER) is None and CLEANRL in args.sides:
            print(f"raysim bench sac: the peer's side is skipped: {MISSING}", file=sys.stderr)
            args.sides = [side for side in args.sides if side != CLEANRL]
        reason = problem(args)
        if reason:
            print(f"raysim bench sac: {reason}", file=sys.stderr)
            return 2
        if RLPD in args.rows:  # where the demonstrations are recorded, unless it says where they are
            os.environ.setdefault("MINARI_DATASETS_PATH", str((args.out / "datasets").resolve()))
        code = measure(args, planned(args))
        if code:
            return code
    path = args.out / RESULTS
    lines = read_results(path)
    if not lines:
        print(f"raysim bench sac: no results in {path} (the recorded ones: --out {RECORDED})", file=sys.stderr)
        return 2
    text = table(lines, grpo_lines(args.finetune_results))
    (args.out / TABLE).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
