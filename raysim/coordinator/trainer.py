"""``Trainer``: the coordinator's loop, a short sequence of named steps over an explicit run state.

    trainer = Trainer(load_config("configs/cartpole_ppo.yaml"))
    summary = trainer.train()          # env steps, wall time, last metrics, run directory
    Trainer.from_run_dir(summary.run_dir).train()     # continue a run from its newest checkpoint

Each iteration: collect (every shard's chunk), update (the learner), maybe evaluate, log, maybe
save; then the stop rules (``stop_reason``) look at the new ``RunState``. It runs in the driver
(``raysim train``, a user's script, or a ``ray job``). Data never passes through it: shards receive
the learner's weights as one object ref, the learner receives the shards' chunk refs. The driver is
the only role that reads or writes the run directory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.algos import algorithm_class
from raysim.checkpoint import CheckpointError, load_latest, save_checkpoint
from raysim.config import Config, ConfigError, check_config, load_resume_config, to_dict
from raysim.coordinator.collector import Collector, LearnerLost
from raysim.coordinator.roles import create_learner, create_roles, create_shard, start_backend
from raysim.coordinator.run_state import RunState
from raysim.coordinator.snapshot import new_run_dir, write_snapshot
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards, write_records
from raysim.identity import differences, env_identity
from raysim.metrics import SinkSet, make_sinks
from raysim.rollout import EnvShard

PHASES = ("time_collect", "time_update", "time_eval", "time_checkpoint")  # seconds per iteration, by phase


@dataclass
class Summary:
    """What ``Trainer.train`` returns."""

    env_steps: int
    iterations: int
    wall_time: float  # seconds of training, Ray start-up, actor creation and evaluation excluded
    startup_time: float  # seconds to start Ray (if needed) and create the actors
    run_dir: str
    metrics: dict[str, float] = field(default_factory=dict)  # the last log step's record
    evaluation: EvalReport | None = None
    interrupted: bool = False  # Ctrl-C, or train.stop_after reached: resume continues
    steps_this_run: int = 0  # env steps collected by this process (a resumed run counts from its checkpoint)


@dataclass
class ResumePoint:
    """Where a resumed run continues: the checkpoint and its counters."""

    checkpoint: Path
    state: dict[str, Any]
    meta: dict[str, Any]


class PhaseClock:
    """Seconds spent per phase since the last log step (``PHASES``), and evaluation time overall."""

    def __init__(self):
        self.start = time.perf_counter()
        self.eval_total = 0.0
        self.reset()

    def reset(self) -> None:
        self.times, self.iterations = dict.fromkeys(PHASES, 0.0), 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            self.times[name] += seconds
            if name == "time_eval":
                self.eval_total += seconds

    def training_seconds(self) -> float:
        """Wall time since the start, evaluation excluded."""
        return time.perf_counter() - self.start - self.eval_total

    def per_iteration(self) -> dict[str, float]:
        """Mean seconds per iteration by phase since the last reset; resets."""
        means = {k: v / max(1, self.iterations) for k, v in self.times.items()}
        self.reset()
        return means


class Trainer:
    """Trains ``config`` with shards and a learner group on Ray (or in-process: ``backend: local``).

    ``Trainer(config).train()`` starts a new run directory; ``Trainer.from_run_dir(path).train()``
    continues a run from its newest intact checkpoint.
    """

    def __init__(
        self, config: Config, address: str | None = None, sinks: list | None = None, resume: ResumePoint | None = None
    ):
        check_config(config)
        self.config = config
        self.address = address
        self.sinks = sinks
        self.resume = resume
        self.run_dir = Path(config.run_dir) if resume else new_run_dir(config)
        self.identity, self.canonical_env = env_identity(to_dict(config.env))
        self.plan = algorithm_class(config.algo.name).collection(config.algo)
        # fixed batches: every iteration collects rows x steps_per_row; else (grouped episodes, elastic
        # shards) the batch varies and the run stops on its env steps. The plan counts the least an
        # iteration collects (one step per row for grouped episodes): the linear schedule's horizon.
        rows, per_row = config.shards.count * config.env.num_envs, self.plan.steps_per_row
        self.fixed_batches = per_row is not None and not config.shards.max
        self.planned = max(1, math.ceil(config.train.total_steps / (rows * (per_row or 1))))
        self.learner_restarts = 0

    @classmethod
    def from_run_dir(
        cls,
        run_dir: str | Path,
        config: str | Path | None = None,
        overrides: list[str] | None = None,
        force: bool = False,
        address: str | None = None,
    ) -> Trainer:
        """A trainer that continues ``run_dir`` (also after the directory was moved).

        ``config``: the run's own snapshot by default; or the original declaration; or an env
        config (such as the run's ``configs/gym.yaml``) that replaces the snapshot's env. An env
        whose identity differs from the checkpoint's is refused, listing every differing key,
        unless ``force``.
        """
        run_dir = Path(run_dir).resolve()
        checkpoint, state, meta = load_latest(run_dir)
        config_obj = load_resume_config(run_dir, config, overrides or [])
        config_obj.run_dir = str(run_dir)
        identity, canonical = env_identity(to_dict(config_obj.env))
        if identity != meta.get("identity"):
            lines = differences(meta.get("canonical_env", {}), canonical)
            message = "the env differs from the checkpoint's:\n  " + "\n  ".join(
                lines or ["(no canonical config saved)"]
            )
            if not force:
                raise ConfigError(f"cannot resume {run_dir}: {message}\nPass --force to resume anyway.")
            print(f"raysim: WARNING: resuming with --force although {message}", flush=True)
        return cls(config_obj, address=address, resume=ResumePoint(checkpoint, state, meta))

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> Summary:
        """Run to ``train.total_steps`` env steps (Ctrl-C stops cleanly), checkpoint, evaluate."""
        t0 = time.perf_counter()
        sinks = None
        backend, started_ray = start_backend(self.config, self.address)
        try:
            self.backend = backend
            self.roles = create_roles(backend, self.config, self.planned)  # self.roles: for inspection
            self.collector = Collector(backend, self.config, self.roles.shards, self.plan)
            state = self._restore() if self.resume else self._begin()
            self.first = state  # where this process started
            startup = time.perf_counter() - t0
            sinks = self.sinks_set = self._sinks(state)
            return self._run(state, startup)
        finally:
            if sinks is not None:  # also when training failed: the console line ends, files are closed
                sinks.close()
            if started_ray:
                import ray

                ray.shutdown()

    def _run(self, state: RunState, startup: float) -> Summary:
        """Iterate until a stop rule holds or Ctrl-C; then the final evaluation and save."""
        self.weights = self.roles.learner.get_weights()
        self.clock, self.record, self.solved = PhaseClock(), {}, None
        self.pending_eval: dict[str, float] = {}  # evaluation metrics waiting for the next log step
        interrupted, reason = False, None
        try:
            while (reason := self.stop_reason(state)) is None:
                state = self._iterate_or_restart(state)
        except KeyboardInterrupt:
            interrupted = True
            print(f"\ninterrupted at iteration {state.iteration}: saving and stopping", flush=True)
        wall = self.clock.training_seconds()
        finished = reason in ("budget", "solved") and not interrupted
        report = self.solved
        if report is None and finished and self.config.eval.episodes > 0:
            report = self._evaluate(state.iteration)
            state = state.scored(report.mean_return)
        self._save(state)
        self.sinks_set.close()
        return Summary(
            state.env_steps,
            state.iteration,
            wall,
            startup,
            str(self.run_dir),
            self.record,
            report,
            not finished,
            state.env_steps - self.first.env_steps,
        )

    def stop_reason(self, state: RunState) -> str | None:
        """Why the run stops after ``state`` (None: it goes on): the evaluation target ``eval.stop_return``,
        the step budget, ``train.stop_after``."""
        cfg = self.config
        if self.solved is not None:
            return "solved"
        if self.budget_reached(state):
            return "budget"
        if cfg.train.stop_after is not None and state.iteration >= self.first.iteration + cfg.train.stop_after:
            return "stop_after"
        return None

    def budget_reached(self, state: RunState) -> bool:
        """``train.total_steps``: the planned iterations of fixed batches, else the env steps collected."""
        if self.fixed_batches:
            return state.iteration >= self.planned
        return state.env_steps >= self.config.train.total_steps

    def _iterate_or_restart(self, state: RunState) -> RunState:
        """One iteration; a learner that died on the way is restarted from the newest checkpoint."""
        try:
            return self._iterate(state)
        except Exception as error:
            lost = isinstance(error, LearnerLost) or (
                self.backend.is_actor_failure(error) and not self.roles.learner.alive()
            )
            if not lost:
                raise
            state = self._restart_learner(error)
            self.weights = self.roles.learner.get_weights()
            return state

    def _iterate(self, state: RunState) -> RunState:
        """Collect, update, maybe evaluate, log, maybe save: one completed iteration, its new state."""
        cfg, roles, clock = self.config, self.roles, self.clock
        log = self._log_due(state.iteration + 1)
        if cfg.shards.max:
            self.collector.grow()
        with clock.phase("time_collect"):
            chunks = self.collector.collect(self.weights)  # futures; dead shards replaced
        with clock.phase("time_update"):
            result = roles.learner.update(chunks, log=log)
            self.weights = roles.learner.get_weights()
        clock.iterations += 1
        before, state = state, state.advanced(int(result["env_steps"]), int(result["policy_version"]))
        if eval_due(cfg, state.iteration, before.env_steps, state.env_steps) and not self.budget_reached(
            state
        ):  # the final evaluation comes after
            with clock.phase("time_eval"):
                report = self._evaluate(state.iteration)
            state = state.scored(report.mean_return)
            self.pending_eval = eval_metrics(report)
            target = cfg.eval.stop_return
            if target is not None and report.mean_return is not None and report.mean_return >= target:
                self.solved = report
        if not log and self.stop_reason(state) is not None:  # the last iteration always logs
            log = True
            result.update(roles.learner.metrics())
        if log:
            self._log(state, result)
        if cfg.checkpoint.every and state.iteration % cfg.checkpoint.every == 0 and self.stop_reason(state) is None:
            with clock.phase("time_checkpoint"):
                self._save(state)
        return state

    def _log_due(self, iteration: int) -> bool:
        """A log step every ``train.log_every`` iterations, and at the last iteration where it is known ahead."""
        cfg = self.config
        last = self.first.iteration + cfg.train.stop_after if cfg.train.stop_after is not None else None
        if self.fixed_batches:
            last = self.planned if last is None else min(self.planned, last)
        return iteration % cfg.train.log_every == 0 or iteration == last

    def _log(self, state: RunState, result: dict[str, float]) -> None:
        """One record to every sink: the learner's metrics, the pending evaluation, counters and timings."""
        elapsed = self.clock.training_seconds()
        record = {k: v for k, v in result.items() if k != "env_steps"}
        record.update(self.pending_eval)
        record.update(self.clock.per_iteration())
        record.update(
            {
                "iteration": state.iteration,
                "env_steps": state.env_steps,
                "time": elapsed,
                "steps_per_s": (state.env_steps - self.first.env_steps) / max(elapsed, 1e-9),
            }
        )
        self.sinks_set.write(record)
        self.record, self.pending_eval = record, {}

    # -- beginning, resuming, restarting --------------------------------------------------------

    def _begin(self) -> RunState:
        """A new run: freeze its configs (the task's resources exported into the run directory)."""
        write_snapshot(self.run_dir, self.config)
        return RunState()

    def _restore(self) -> RunState:
        """Load the checkpoint into every learner rank and into the shards; the run state it describes."""
        point, roles = self.resume, self.roles
        roles.learner.load_state(point.state)
        saved = point.state.get("shards") or []
        if len(saved) == len(roles.shards):
            calls = [s.call(EnvShard.set_state, state) for s, state in zip(roles.shards, saved, strict=True)]
            modes = self.backend.get(calls)
            how = "exactly" if all(m == "exact" for m in modes) else "; ".join(sorted(set(modes)))
        else:
            how = f"with fresh episodes ({len(saved)} shards saved, {len(roles.shards)} now)"
        state = RunState.from_checkpoint(point.meta, point.state)
        print(
            f"raysim: resuming {self.run_dir} from {point.checkpoint} (iteration {state.iteration}, "
            f"{state.env_steps:,} env steps); shards continue {how}",
            flush=True,
        )
        return state

    def _restart_learner(self, error: Exception) -> RunState:
        """A new learner group, restored from the newest checkpoint (or fresh when there is none)."""
        cfg, roles = self.config, self.roles
        self.learner_restarts += 1
        if self.learner_restarts > cfg.learner.max_restarts:
            raise RuntimeError(
                f"the learner died and {cfg.learner.max_restarts} restarts are used up (learner.max_restarts): {error}"
            ) from error
        for handle in roles.learner.handles:
            self.backend.kill(handle)
        roles.learner = create_learner(self.backend, cfg, roles.spaces, self.planned)
        try:
            checkpoint, state, meta = load_latest(self.run_dir)
        except CheckpointError:
            print(
                f"raysim: fault: the learner died ({type(error).__name__}); no checkpoint yet: "
                "restarted it from scratch",
                flush=True,
            )
            return RunState()
        roles.learner.load_state(state)
        print(
            f"raysim: fault: the learner died ({type(error).__name__}); restarted it from {checkpoint} "
            f"(iteration {meta['iteration']})",
            flush=True,
        )
        return RunState.from_checkpoint(meta, state)

    # -- storage, evaluation, sinks ---------------------------------------------------------------

    def _save(self, state: RunState) -> None:
        learner_state = self.roles.learner.state_dict()
        learner_state["shards"] = self.backend.get([s.call(EnvShard.get_state) for s in self.roles.shards])
        meta = {**state.meta(), "identity": self.identity, "canonical_env": self.canonical_env}
        save_checkpoint(self.run_dir, state.iteration, learner_state, meta, keep_last=self.config.checkpoint.keep_last)

    def _evaluate(self, iteration: int) -> EvalReport:
        cfg, backend, roles = self.config, self.backend, self.roles
        report = evaluate_on_shards(
            backend,
            lambda i: create_shard(backend, cfg, i, evaluation=True),
            roles.eval_shards,
            [cfg.eval.num_envs] * len(roles.eval_shards),
            self.weights,
            EvalSpec.of(cfg.eval, roles.max_episode_steps),
        )
        write_records(self.run_dir / "eval" / f"{iteration}.parquet", report.records)
        return report

    def _sinks(self, state: RunState) -> SinkSet:
        if self.sinks is not None:
            return SinkSet(self.sinks)
        cfg = self.config
        return make_sinks(
            cfg.train.sinks,
            self.run_dir,
            cfg.train.total_steps,
            keep_until=state.iteration,
            env_steps=state.env_steps if self.resume else 0,
        )


def eval_due(config: Config, iteration: int, steps_before: int, env_steps: int) -> bool:
    """Whether an evaluation follows this iteration: every ``eval.every`` iterations, and/or each
    time the env steps pass a multiple of ``eval.every_steps``."""
    cfg = config.eval
    by_iteration = bool(cfg.every) and iteration % cfg.every == 0
    by_steps = bool(cfg.every_steps) and env_steps // cfg.every_steps > steps_before // cfg.every_steps
    return by_iteration or by_steps


def eval_metrics(report: EvalReport) -> dict[str, float]:
    """The metrics of an evaluation during training: mean return, and the success rate where defined."""
    metrics = {"eval_return": math.nan if report.mean_return is None else report.mean_return}
    rate = report.success_rate
    if rate is not None and rate.value is not None:
        metrics["eval_success_rate"] = rate.value
    return metrics
