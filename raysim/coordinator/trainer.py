"""``Trainer``: the coordinator's loop, a short sequence of named steps over an explicit run state.

    trainer = Trainer(load_config("configs/cartpole_ppo.yaml"))
    summary = trainer.train()          # env steps, wall time, last metrics, run directory
    Trainer.from_run_dir(summary.run_dir).train()     # continue a run from its newest checkpoint

Each iteration: collect (every shard's chunk), update (the learner), maybe evaluate, log, maybe
save; then the stop rules (``stop_reason``) look at the new ``RunState``. Every completed iteration
leaves its learner and shard states ready in the object store (``Ready``), so whatever stops the run
(the budget, ``train.stop_after``, SIGINT or SIGTERM at any phase, a failure, the learner's death) it
ends with a checkpoint of its last completed iteration, and the final evaluation comes after that
checkpoint is safe. It runs in the driver (``raysim train``, a user's script, or a ``ray job``);
data never passes through it, and it is the only role that reads or writes the run directory.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.actors import Backend, InputLost, cause, describe
from raysim.algos import algorithm_class
from raysim.checkpoint import Checkpoint, CheckpointError, Checkpoints
from raysim.config import Config, ConfigError, check_config, load_resume_config, to_dict
from raysim.coordinator.cluster import start_backend
from raysim.coordinator.collector import Batch, Collector
from raysim.coordinator.memory import memory_need
from raysim.coordinator.phases import PhaseClock
from raysim.coordinator.preflight import check_env_and_model, check_renders, check_run_dir, check_weights_fit
from raysim.coordinator.roles import create_learner, create_roles, start_shard
from raysim.coordinator.run_state import RunState
from raysim.coordinator.signals import StopRequested, StopSignals
from raysim.coordinator.snapshot import SNAPSHOT, changed_settings, choose_run_dir, resume_refusal, write_snapshot
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards
from raysim.identity import checkpoint_identity, differences, env_identity
from raysim.learner.group import combined
from raysim.learner.inputs import ChunksLost
from raysim.metrics import SinkSet, make_sinks
from raysim.recording import film_into
from raysim.records import write_evaluation
from raysim.rollout import EnvShard
from raysim.storage import RunLock, is_uri, open_storage
from raysim.video import require_video

FINISHED = ("budget", "solved")  # the stop reasons of a run that reached its end
VIDEOS = "videos"  # the run's folder of evaluation videos (``eval.video``)

#: Called at every log step with its metrics record and the checkpoint saved in that iteration (or None); True
#: ends the run after that iteration (``stopped_by`` "reporter"). The end of the run is in its ``Summary`` (a Tune
#: trial reports it once the run closed: ``final_metrics``).
Reporter = Callable[[dict[str, float], Checkpoint | None], bool]


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
    interrupted: bool = False  # stopped before the end (a signal, train.stop_after, the reporter): resume continues
    steps_this_run: int = 0  # env steps collected by this process (a resumed run counts from its checkpoint)
    stopped_by: str = "budget"  # budget | solved | stop_after | reporter | SIGINT | SIGTERM
    checkpoint: Checkpoint | None = None  # the run's last checkpoint

    @property
    def final_metrics(self) -> dict[str, float]:
        """The last log step's record with the final evaluation's metrics."""
        return {**self.metrics, **(eval_metrics(self.evaluation) if self.evaluation else {})}

    @property
    def exit_code(self) -> int:
        """130 after SIGINT, 143 after SIGTERM, else 0 (also for ``train.stop_after``)."""
        return 128 + signal.Signals[self.stopped_by] if self.stopped_by.startswith("SIG") else 0


@dataclass
class ResumePoint:
    """Where a resumed run continues: the checkpoint and its counters (no checkpoint: the run starts over)."""

    checkpoint: Checkpoint | None
    state: dict[str, Any]
    meta: dict[str, Any]
    force: bool = False  # the env differs from the checkpoint's and the user insisted
    new_config: bool = False  # the config differs from the run's snapshot (a sweep's mutated hyperparameters)
    changed: list[str] = field(default_factory=list)  # settings a resume's --set changed: kept in the snapshot


class RunFailed(RuntimeError):
    """Training failed mid-run; its last completed iteration was saved first (the message says how to resume)."""


@dataclass
class Ready:
    """The last completed iteration: its run state and the learner's and shards' states, not fetched yet.

    They were taken right after the iteration's update and collection and wait in the object store, so a
    checkpoint of this iteration needs no learner (it may be busy, or dead) and takes one fetch.
    """

    state: RunState
    learner: list[Any] = field(default_factory=list)  # every rank's ``Learner.snapshot`` (futures)
    shards: list[Any] = field(default_factory=list)  # every shard's ``EnvShard.get_state`` (futures)
    loaded: dict[str, Any] | None = None  # or: a checkpoint's whole state, as loaded
    saved: Checkpoint | None = None  # its checkpoint, once written

    def fetch(self, backend: Backend) -> dict[str, Any]:
        """The checkpoint state of this iteration: every learner rank's part and every shard's state."""
        if self.loaded is not None:
            return self.loaded
        state = combined(backend.get(self.learner)) if self.learner else {}
        state["shards"] = backend.get(self.shards)
        return state


class Trainer:
    """Trains ``config`` with shards and a learner group on Ray (or in-process: ``backend: local``).

    ``Trainer(config).train()`` starts a new run directory; ``Trainer.from_run_dir(path).train()``
    continues a run from its newest intact checkpoint. ``break_lock`` takes the run directory over
    from a process that holds its lock (one that is gone is detected without it). ``reporter``: see
    ``Reporter``.
    """

    def __init__(
        self,
        config: Config,
        address: str | None = None,
        sinks: list | None = None,
        resume: ResumePoint | None = None,
        break_lock: bool = False,
        reporter: Reporter | None = None,
    ):
        check_config(config)
        self.spaces = check_env_and_model(config)
        if config.eval.video:
            require_video()
            check_renders(config)
        if resume is not None and resume.force:
            check_weights_fit(self.spaces, config, resume.state.get("model") or {}, f"cannot resume {config.run_dir}")
        self.config = config
        self.address = address
        self.sinks = sinks
        self.resume = resume
        self.break_lock = break_lock
        self.reporter = reporter
        self.reporter_stop = False  # the reporter asked the run to end
        self.run_dir, self.note = (config.run_dir, None) if resume else choose_run_dir(config)
        check_run_dir(self.run_dir, resume=resume is not None)
        self.storage = open_storage(self.run_dir)
        self.checkpoints = Checkpoints(self.storage)
        self.identity, self.canonical_env = env_identity(to_dict(config.env))
        self.plan = algorithm_class(config.algo.name).collection(config.algo)
        # fixed batches: every iteration collects rows x steps_per_row; else (grouped episodes, elastic
        # shards) the batch varies and the run stops on its env steps. The schedule's horizon, in env
        # steps: what the planned iterations of fixed batches collect, else the budget.
        rows, per_row = config.shards.count * config.env.num_envs, self.plan.steps_per_row
        self.fixed_batches = per_row is not None and not config.shards.max and config.shards.first_arrived >= 1
        self.planned = planned_iterations(config)
        self.horizon = self.planned * rows * per_row if self.fixed_batches else config.train.total_steps
        self.learner_restarts = 0
        self.fault_at = os.environ.get("RAYSIM_FAULT_AT", "")  # tests: "<phase>:<iteration>[:kill|term|int]"

    @classmethod
    def from_run_dir(
        cls,
        run_dir: str | Path,
        config: str | Path | None = None,
        overrides: list[str] | None = None,
        force: bool = False,
        address: str | None = None,
        break_lock: bool = False,
    ) -> Trainer:
        """A trainer that continues ``run_dir`` (also after the directory was moved).

        ``config``: the run's own snapshot by default; or the original declaration; or an env
        config (such as the run's ``configs/gym.yaml``) that replaces the snapshot's env. An env
        whose identity differs from the checkpoint's is refused, listing every differing key,
        unless ``force``; a model or algorithm that differs is always refused. What ``overrides``
        change is kept in the run's snapshot. A run without a checkpoint starts over from its configs.
        """
        run_dir = str(run_dir) if is_uri(str(run_dir)) else str(Path(run_dir).resolve())
        storage = open_storage(run_dir)
        checkpoints = Checkpoints(storage)
        start_over = not checkpoints.complete() and storage.exists(SNAPSHOT)  # stopped before its first checkpoint
        if not start_over:
            checkpoint, state, meta = checkpoints.newest_intact()
        root = storage.local_copy("configs", "resources")
        config_obj = load_resume_config(root, config, overrides or [])
        config_obj.run_dir = run_dir
        changed = changed_settings(load_resume_config(root, config, []), config_obj) if overrides else []
        if start_over:
            point = ResumePoint(None, {}, {}, changed=changed)
            return cls(config_obj, address=address, resume=point, break_lock=break_lock)
        refusal = resume_refusal(meta, config_obj)
        if refusal:
            raise ConfigError(f"cannot resume {run_dir}: {refusal}")
        identity, canonical = env_identity(to_dict(config_obj.env))
        saved, saved_canonical = checkpoint_identity(meta)  # in today's form: older runs resume too
        if identity != saved:
            lines = differences(saved_canonical, canonical)
            message = "the env differs from the checkpoint's:\n  " + "\n  ".join(
                lines or ["(no canonical config saved)"]
            )
            if not force:
                raise ConfigError(f"cannot resume {run_dir}: {message}\nPass --force to resume anyway.")
            print(f"raysim: WARNING: resuming with --force although {message}", flush=True)
        point = ResumePoint(checkpoint, state, meta, force=identity != saved, changed=changed)
        return cls(config_obj, address=address, resume=point, break_lock=break_lock)

    # -- the run -------------------------------------------------------------------------------

    def train(self) -> Summary:
        """Run to ``train.total_steps`` env steps, checkpoint, evaluate; a signal or a failure at any phase
        ends with a checkpoint of the last completed iteration (``Summary.stopped_by`` says why it stopped)."""
        t0 = time.perf_counter()
        self.announce()
        self.sinks_set, lock, started_ray = None, RunLock(self.storage), False
        created = made = discard = False  # a new run this process locked, its local directory made here, failed
        try:
            if self.resume:  # a second process on the run is refused before Ray starts
                self._lock(lock)
            self.backend, started_ray = start_backend(self.config, self.address, memory_need(self.config, self.spaces))
            if not self.resume:  # the run directory appears once its roles are sure to fit
                if self.storage.is_local:
                    made = not Path(self.run_dir).exists()
                    Path(self.run_dir).mkdir(parents=True, exist_ok=True)
                self._lock(lock)
                created = True
            with StopSignals() as self.signals:
                try:
                    self._prepare()
                except StopRequested as stop:  # before any iteration: nothing to save
                    print(f"\nraysim: {stop.name} before the first iteration completed: nothing to save", flush=True)
                    return Summary(
                        0, 0, 0.0, time.perf_counter() - t0, str(self.run_dir), interrupted=True, stopped_by=stop.name
                    )
                return self._run(time.perf_counter() - t0)
        except Exception:
            discard = created and (getattr(self, "ready", None) is None or self.ready.state.iteration == 0)
            raise
        finally:
            if self.sinks_set is not None:  # also when training failed: the console line ends, files are closed
                self.sinks_set.close()
            self._release_roles()
            if discard:  # failed before its first iteration: nothing in it can be used
                self._discard_run_dir(lock, made)
            lock.release()  # only if this process holds it
            self.storage.close()
            if started_ray:
                import ray

                ray.shutdown()

    def announce(self) -> None:
        """Say (once) where the run goes when its default name was taken (the CLI does it in its first line)."""
        if self.note:
            print(f"raysim: {self.note}", flush=True)
            self.note = None

    def _discard_run_dir(self, lock: RunLock, made: bool) -> None:
        """Remove what this new run created in its run directory (which held nothing before it: ``choose_run_dir``),
        the lock last, and the directory if it ``made`` it; nothing if another process took the lock over."""
        if not lock.clear_run():
            return
        lock.release()
        if made:
            Path(self.run_dir).rmdir()
        what = self.run_dir if made else f"what the run wrote in {self.run_dir}"
        print(f"raysim: removed {what}: the run failed before its first iteration completed", flush=True)

    def _lock(self, lock: RunLock) -> None:
        note = lock.acquire(force=self.break_lock)
        if note:
            print(f"raysim: {self.run_dir}: {note}", flush=True)

    def _release_roles(self) -> None:
        """The run's actors end with it (their CPUs go back to the cluster at once)."""
        roles = getattr(self, "roles", None)
        if roles is not None:
            for handle in [*roles.shards, *roles.eval_shards, *roles.learner.handles]:
                self.backend.kill(handle)

    def _prepare(self) -> None:
        """Roles, the run state to start from (a new run's snapshot, or a checkpoint's), the sinks."""
        self.roles = create_roles(self.backend, self.config, self.horizon, self.spaces)  # self.roles: for inspection
        self.collector = Collector(self.backend, self.config, self.roles.shards, self.plan, self.config.learner.ranks)
        self.ready = self._restore() if self.resume else self._begin()
        self.collector.reset()
        self.first = self.ready.state  # where this process started
        self.sinks_set = self._sinks(self.first)

    def _run(self, startup: float) -> Summary:
        """Iterate until a stop rule, a signal or a failure; save; then the final evaluation."""
        self.weights = self.roles.learner.get_weights()
        self.clock, self.record, self.solved = PhaseClock(), {}, None
        self.last_save = time.monotonic()
        failure: BaseException | None = None
        if self.resume and self.budget_reached(self.ready.state):
            state, total = self.ready.state, self.config.train.total_steps
            print(
                f"raysim: nothing to train: the run is at {state.env_steps:,} env steps and the config's budget is "
                f"train.total_steps={total:,}; to train longer: raysim resume {self.run_dir} "
                f"--set train.total_steps=<more>",
                flush=True,
            )
        try:
            while (reason := self.stop_reason(self.ready.state)) is None:
                self._iterate_or_restart()
        except (StopRequested, KeyboardInterrupt) as stop:
            reason = stop.name if isinstance(stop, StopRequested) else "SIGINT"
            print(f"\nraysim: {reason}: stopping; the iteration in progress is abandoned", flush=True)
        except Exception as error:  # noqa: BLE001 - saved first, then raised as RunFailed
            reason, failure = "failed", error
        wall = self.clock.training_seconds()
        try:
            self._final_save(failure)
        except StopRequested as stop:  # it arrived during the final save, which finished first
            reason = stop.name
        report = self.solved
        evaluated = self.ready.saved is not None and self.checkpoints.score(self.ready.saved) is not None
        if reason in FINISHED and report is None and self.config.eval.episodes > 0 and not evaluated:
            try:
                report = self._final_evaluation()
            except (StopRequested, KeyboardInterrupt) as stop:
                reason = stop.name if isinstance(stop, StopRequested) else "SIGINT"
                print(f"\nraysim: {reason} during the final evaluation: it was not finished", flush=True)
        self.sinks_set.close()
        state = self.ready.state
        if reason not in FINISHED:
            print(f"raysim: continue with `raysim resume {self.run_dir}`", flush=True)
        stopped = reason not in FINISHED
        steps = state.env_steps - self.first.env_steps
        return Summary(
            state.env_steps,
            state.iteration,
            wall,
            startup,
            str(self.run_dir),
            self.record,
            report,
            stopped,
            steps,
            reason,
            self.ready.saved,
        )

    def stop_reason(self, state: RunState) -> str | None:
        """Why the run stops after ``state`` (None: it goes on): the evaluation target ``eval.stop_return``,
        the step budget, ``train.stop_after``, the reporter."""
        if self.reporter_stop:
            return "reporter"
        if self.solved is not None:
            return "solved"
        if self.budget_reached(state):
            return "budget"
        if self._stop_after_reached(state):
            return "stop_after"
        return None

    def _stop_after_reached(self, state: RunState) -> bool:
        stop_after = self.config.train.stop_after
        return stop_after is not None and state.iteration >= self.first.iteration + stop_after

    def budget_reached(self, state: RunState) -> bool:
        """``train.total_steps``: the planned iterations of fixed batches, else the env steps collected."""
        if self.fixed_batches:
            return state.iteration >= self.planned
        return state.env_steps >= self.config.train.total_steps

    # -- one iteration -------------------------------------------------------------------------

    def _iterate_or_restart(self) -> None:
        """One iteration; a learner that died in any phase is restarted from the last completed iteration."""
        try:
            self._iterate()
        except Exception as error:
            if not (isinstance(error, InputLost) or not self.roles.learner.alive()):
                raise
            self._restart_learner(error)

    def _iterate(self) -> None:
        """Collect, update, maybe evaluate, log; then the iteration is complete (``self.ready``); maybe save.

        A stop or a failure before the end abandons the iteration whole: the last completed one stays
        what a checkpoint describes, with its metrics rows.
        """
        cfg, roles, clock = self.config, self.roles, self.clock
        before = self.ready.state
        iteration = before.iteration + 1
        log = self._log_due(iteration)
        if cfg.shards.max:
            self.collector.grow()
        with clock.phase("time_collect"):  # the learner idles here: waiting for chunks
            batch = self.collector.collect(self.weights, before.version)  # futures; dead shards replaced
        self._fault("collect", iteration)
        with clock.phase("time_update"):  # the shards collect ahead meanwhile (algo.max_policy_lag)
            result = self._update(batch, log, before.env_steps)
            self.weights = roles.learner.get_weights()
        result["policy_lag"] = before.version - min(batch.versions)  # the oldest weights trained on
        self._fault("update", iteration)
        clock.iterations += 1
        seconds = self.first.seconds + clock.training_seconds()  # the run's, continued across processes
        state = before.advanced(int(result["env_steps"]), int(result["policy_version"]), seconds)
        report = None
        if eval_due(cfg, state.iteration, before.env_steps, state.env_steps) and not self.budget_reached(state):
            with clock.phase("time_eval"):  # the final evaluation comes after the final save
                report = self._evaluate(state.iteration)
            state = state.scored(report.mean_return, eval_metrics(report))  # metrics for the next row
            target = cfg.eval.stop_return
            if target is not None and report.mean_return is not None and report.mean_return >= target:
                self.solved = report
        if not log and (self.solved is not None or self.budget_reached(state)):
            log = True  # the run's last iteration always logs (a stopped one leaves its window to the resume)
            result.update(roles.learner.metrics())
        if log:
            self._log(state, result)
            state = state.logged()
        self.ready = Ready(state, roles.learner.snapshots, list(self.collector.states))  # iteration complete
        if report is not None or (self._save_due() and self.stop_reason(state) is None):
            with clock.phase("time_checkpoint"), self.signals.deferred():  # an evaluated iteration is saved
                checkpoint = self._save()
                if report is not None:
                    self.checkpoints.record_score(checkpoint, report.mean_return)
        if log and self.reporter is not None:
            self.reporter_stop = bool(self.reporter(self.record, self.ready.saved))

    def _update(self, batch: Batch, log: bool, env_steps: int) -> dict[str, float]:
        """The learner's update on ``batch``. Chunks lost with their node before the learner read them (no rank
        updated) are collected again by their shards' replacements, and the update runs on the whole batch."""
        while True:
            try:
                return self.roles.learner.update(batch.parts, batch.stale, log=log, env_steps=env_steps)
            except Exception as error:
                lost = cause(error)
                if not isinstance(lost, ChunksLost):
                    raise
                self.collector.recollect(batch, lost)

    def _log_due(self, iteration: int) -> bool:
        """A log step every ``train.log_every`` iterations, and at the run's last iteration where it is known
        ahead. A process stopped earlier (``train.stop_after``, a signal) writes no row of its own: its
        metric windows are saved, and the resumed run's rows are the uninterrupted run's."""
        last = self.planned if self.fixed_batches else None
        return iteration % self.config.train.log_every == 0 or iteration == last

    def _save_due(self) -> bool:
        """Every ``checkpoint.every`` iterations and every ``checkpoint.every_seconds`` of wall time."""
        cfg = self.config.checkpoint
        by_iterations = bool(cfg.every) and self.ready.state.iteration % cfg.every == 0
        by_time = bool(cfg.every_seconds) and time.monotonic() - self.last_save >= cfg.every_seconds
        return by_iterations or by_time

    def _log(self, state: RunState, result: dict[str, float]) -> None:
        """One record to every sink: the learner's metrics, the evaluations since the last row, counters and
        timings (``time``: the run's training seconds, continued across resumes)."""
        elapsed = self.clock.training_seconds()
        record = {k: v for k, v in result.items() if k != "env_steps"}
        record.update(state.unlogged)
        record.update(self.clock.per_iteration())
        record.update(
            {
                "iteration": state.iteration,
                "env_steps": state.env_steps,
                "time": state.seconds,
                "steps_per_s": (state.env_steps - self.first.env_steps) / max(elapsed, 1e-9),
            }
        )
        self.sinks_set.write(record)
        self.record = record

    # -- saving and evaluating -------------------------------------------------------------------

    def _save(self, final: bool = False) -> Checkpoint:
        """A checkpoint of the last completed iteration (from its ready states; no learner needed); pruned."""
        ready = self.ready
        if ready.saved is not None:
            return ready.saved
        learner_state = ready.fetch(self.backend)
        self.sinks_set.flush()  # the metrics rows the checkpoint covers are written first
        meta = {
            **ready.state.meta(),
            "identity": self.identity,
            "canonical_env": self.canonical_env,
            "model": to_dict(self.config.model),
            "algo": self.config.algo.name,
        }
        phase = "final_save" if final else "save"
        ready.saved = self.checkpoints.save(
            ready.state.iteration, learner_state, meta, before_marker=lambda: self._fault(phase, ready.state.iteration)
        )
        self.checkpoints.prune(self.config.checkpoint.keep_last)
        self.last_save = time.monotonic()
        return ready.saved

    def _final_save(self, failure: BaseException | None) -> None:
        """Save the last completed iteration (a signal meanwhile waits for it); after a failure, raise it as
        ``RunFailed``, saying how to resume."""
        state = self.ready.state
        if state.iteration == 0:
            if failure is not None:
                raise RunFailed(f"{describe(failure)}\n(no iteration had completed: nothing was saved)") from failure
            return
        stop = None
        try:
            with self.signals.deferred():
                checkpoint = self._save(final=True)
        except StopRequested as caught:
            stop = caught
        except Exception as error:
            try:
                where = (
                    f"the newest intact checkpoint is {self.storage.path(self.checkpoints.newest_intact(False)[0].rel)}"
                )
            except CheckpointError:
                where = "there is no intact checkpoint"
            cause = f"{describe(failure)}\nand saving" if failure is not None else "saving"
            raise RunFailed(
                f"{cause} iteration {state.iteration} failed: {describe(error)}\n"
                f"{where}; after fixing the cause: raysim resume {self.run_dir}"
            ) from error
        print(
            f"raysim: saved iteration {state.iteration} ({state.env_steps:,} env steps): "
            f"{self.storage.path(checkpoint.rel)}",
            flush=True,
        )
        if failure is not None:
            raise RunFailed(
                f"{describe(failure)}\nthe last completed iteration ({state.iteration}) "
                f"is saved; after fixing the cause: raysim resume {self.run_dir}"
            ) from failure
        if stop is not None:
            raise stop

    def _evaluate(self, iteration: int) -> EvalReport:
        """Evaluate the current weights (those of ``iteration``); the records go to ``eval/<iteration>.parquet``, and
        with ``eval.video`` its film to ``videos/<iteration>.mp4``."""
        cfg, backend, roles = self.config, self.backend, self.roles
        self._fault("eval", iteration)
        filming = film_into(self.storage, f"{VIDEOS}/{iteration}.mp4", cfg.eval) if cfg.eval.video else nullcontext()
        with filming as film:
            report = evaluate_on_shards(
                backend,
                lambda i: start_shard(backend, cfg, i, evaluation=True),
                roles.eval_shards,
                [cfg.eval.num_envs] * len(roles.eval_shards),
                self.weights,
                EvalSpec.of(cfg.eval, roles.max_episode_steps),
                film=film,
            )
        write_evaluation(self.storage, iteration, report.records)
        return report

    def _final_evaluation(self) -> EvalReport:
        """The final evaluation of the saved last iteration; its checkpoint carries the score.

        A learner that died since (its weights lost with it) is restarted from that checkpoint first. A
        failure (no room for that learner within ``resources_timeout``) is ``RunFailed``, naming the saved
        iteration and how to evaluate it.
        """
        iteration = self.ready.state.iteration
        self._fault("final_eval", iteration)
        try:
            try:
                report = self._evaluate(iteration)
            except InputLost as error:
                self._restart_learner(error)
                report = self._evaluate(iteration)
        except Exception as error:
            raise RunFailed(
                f"{describe(error)}\nthe final evaluation did not finish; iteration {iteration} is saved: "
                f"evaluate it with `raysim eval {self.run_dir}`"
            ) from error
        self.checkpoints.record_score(self.ready.saved, report.mean_return)
        self.ready.state = self.ready.state.scored(report.mean_return)
        return report

    # -- beginning, resuming, restarting --------------------------------------------------------

    def _begin(self) -> Ready:
        """A new run: freeze its configs (the task's resources exported into the run directory)."""
        write_snapshot(self.storage, self.config)
        return Ready(RunState(), [], [])

    def _restore(self) -> Ready:
        """Load the checkpoint into every learner rank and into the shards; the run state it describes.

        The checkpoint defines the run's timeline: what is newer is retired before anything is written. A run
        without a checkpoint (stopped before its first one) starts over from its configs.
        """
        point = self.resume
        if point.checkpoint is None:
            print(f"raysim: {self.run_dir} has no checkpoint: starting the run over from its configs", flush=True)
            self.storage.remove("tb")  # the records of the process that stopped go (metrics: with the sinks)
        state = RunState.from_checkpoint(point.meta, point.state) if point.checkpoint else RunState()
        self._abandon_after(state.iteration)
        if point.force or point.new_config or point.changed:  # the run's own snapshot: what it now trains with
            write_snapshot(self.storage, self.config)
        if point.changed:
            print(f"raysim: the run's config {self.storage.path(SNAPSHOT)} now keeps {', '.join(point.changed)}")
        if point.checkpoint is None:
            return Ready(state)
        how = self._load_roles(point.state)
        print(
            f"raysim: resuming {self.run_dir} from {self.storage.path(point.checkpoint.rel)} "
            f"(iteration {state.iteration}, {state.env_steps:,} env steps); shards continue {how}",
            flush=True,
        )
        return Ready(state, loaded=point.state, saved=point.checkpoint)

    def _load_roles(self, state: dict[str, Any]) -> str:
        """Every learner rank and every shard from a checkpoint's state; how the shards continue (another shard
        count: every shard starts fresh episodes, keyed by the policy version the run continues from)."""
        roles = self.roles
        roles.learner.load_state(state)
        saved = state.get("shards") or []
        if saved and len(saved) == len(roles.shards):
            calls = [s.call(EnvShard.set_state, state) for s, state in zip(roles.shards, saved, strict=True)]
            modes = self.backend.get(calls)
            return "exactly" if all(m == "exact" for m in modes) else "; ".join(sorted(set(modes)))
        self.backend.get([s.call(EnvShard.start_fresh, int(state["version"])) for s in roles.shards])
        return f"with fresh episodes ({len(saved or [])} shards saved, {len(roles.shards)} now)"

    def _restart_learner(self, error: Exception) -> None:
        """A new learner group from the last completed iteration's ready state, else the newest checkpoint."""
        cfg, roles = self.config, self.roles
        self.learner_restarts += 1
        if self.learner_restarts > cfg.learner.max_restarts:
            raise RuntimeError(
                f"the learner died and {cfg.learner.max_restarts} restarts are used up (learner.max_restarts): {error}"
            ) from error
        for handle in roles.learner.handles:
            self.backend.kill(handle)
        roles.learner = create_learner(self.backend, cfg, roles.spaces, self.horizon)
        died = f"raysim: fault: the learner died ({type(error).__name__})"
        if self.ready.state.iteration == 0:
            print(f"{died} before the first iteration completed: started a new one", flush=True)
        else:
            source, state = self._surviving_state()
            if state is None:
                print(
                    f"{died} and no state of it survived: restarted it from scratch; "
                    f"{self.ready.state.iteration} iteration(s) are lost",
                    flush=True,
                )
                self._rewind(Ready(RunState()))
            else:
                how = self._load_roles(state)
                print(f"{died}; restarted it from {source}; shards continue {how}", flush=True)
        self.collector.reset()  # chunks in flight acted for the lost learner's future: collected anew
        self.weights = roles.learner.get_weights()

    def _surviving_state(self) -> tuple[str, dict[str, Any] | None]:
        """The last completed iteration's ready state, or (lost with its node) the newest intact checkpoint's."""
        try:
            return f"the last completed iteration {self.ready.state.iteration}", self.ready.fetch(self.backend)
        except Exception:  # noqa: BLE001 - the ready state was lost: fall back to storage
            pass
        try:
            checkpoint, state, meta = self.checkpoints.newest_intact()
        except CheckpointError:
            return "", None
        restored = RunState.from_checkpoint(meta, state)
        self._rewind(Ready(restored, loaded=state, saved=checkpoint))
        return f"checkpoint {self.storage.path(checkpoint.rel)} (iteration {restored.iteration})", state

    def _rewind(self, ready: Ready) -> None:
        """Continue from an earlier iteration: checkpoints, sinks and evaluation records drop what came after it."""
        self.ready, state = ready, ready.state
        if state.iteration < self.first.iteration:
            self.first = state
        self._abandon_after(state.iteration)
        self.sinks_set.rewind(state.iteration, state.env_steps)

    def _abandon_after(self, iteration: int) -> None:
        """The run continues from ``iteration``: the checkpoints and evaluation records of later iterations
        belong to an abandoned timeline, retired before the run writes anything (pruning sees the live one)."""
        self.checkpoints.retire_after(iteration)
        self._drop_records_after(iteration)

    def _drop_records_after(self, iteration: int) -> None:
        """Evaluation records and videos of iterations after ``iteration`` (an abandoned future) are removed."""
        for folder in ("eval", VIDEOS):
            for name in self.storage.list(folder):
                stem = name.partition(".")[0]
                if stem.isdigit() and int(stem) > iteration:
                    self.storage.remove(f"{folder}/{name}")

    def _sinks(self, state: RunState) -> SinkSet:
        if self.sinks is not None:
            return SinkSet(self.sinks)
        cfg = self.config
        return make_sinks(
            cfg.train.sinks,
            self.storage,
            cfg.train.total_steps,
            keep_until=state.iteration,
            env_steps=state.env_steps if self.resume else 0,
        )

    def _fault(self, phase: str, iteration: int) -> None:
        """Tests: ``RAYSIM_FAULT_AT=<phase>:<iteration>[:kill|term|int|learner]`` kills this process, signals
        it, or kills the learner there (phases: collect, update, eval, save, final_save, final_eval)."""
        if not self.fault_at:
            return
        where, at, *action = self.fault_at.split(":")
        if where != phase or int(at) != iteration:
            return
        self.fault_at = ""  # once
        how = action[0] if action else "kill"
        if how == "learner":
            for handle in self.roles.learner.handles:
                self.backend.kill(handle)
            return
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[how])


def planned_iterations(config: Config) -> int:
    """The iterations ``train.total_steps`` takes at rows x steps per row each (the most, for varying batches)."""
    per_row = algorithm_class(config.algo.name).collection(config.algo).steps_per_row
    rows = config.shards.count * config.env.num_envs
    return max(1, math.ceil(config.train.total_steps / (rows * (per_row or 1))))


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
