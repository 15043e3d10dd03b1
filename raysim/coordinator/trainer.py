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

The steps share one ``Session`` (opened by ``_open``); checkpoints are written by ``saving``,
evaluations run by ``training_eval``, and resuming, learner restarts and rewinds are ``recovery``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from raysim.actors import Backend, InputLost, cause
from raysim.algos import algorithm_class
from raysim.checkpoint import Checkpoint, Checkpoints, meta_json
from raysim.config import Config, check_config, to_dict
from raysim.coordinator.claim import RunClaim
from raysim.coordinator.cluster import start_backend, stop_ray
from raysim.coordinator.collector import Collected, Collector
from raysim.coordinator.faults import on_phase
from raysim.coordinator.memory import memory_need
from raysim.coordinator.preflight import check_env_and_model, check_renders, check_run_dir, check_weights_fit
from raysim.coordinator.pretrained import read_pretrained
from raysim.coordinator.recovery import ResumePoint, restart_learner, restore, resume_point
from raysim.coordinator.replay import ReplayLog, refill
from raysim.coordinator.roles import create_roles
from raysim.coordinator.run_state import RunState
from raysim.coordinator.saving import RunFailed, end_run, final_save, save, save_due
from raysim.coordinator.schedule import Schedule, nothing_to_train, planned_iterations
from raysim.coordinator.session import Ready, Session, end_roles, open_sinks
from raysim.coordinator.signals import StopRequested, StopSignals
from raysim.coordinator.snapshot import choose_run_dir, default_run_dirs, write_snapshot
from raysim.coordinator.summary import FINISHED, Summary
from raysim.coordinator.teacher import TEACHER_COPY, read_teacher, save_teacher, teacher_meta
from raysim.coordinator.training_data import read_demonstrations
from raysim.coordinator.training_eval import eval_due, eval_metrics, evaluate_iteration, final_evaluation
from raysim.identity import env_identity
from raysim.learner.inputs import ChunksLost
from raysim.metrics import SinkSet
from raysim.storage import open_storage
from raysim.video import require_video

__all__ = ["FINISHED", "Reporter", "ResumePoint", "RunFailed", "Summary", "Trainer", "planned_iterations"]

#: Called at every log step with its metrics record and the checkpoint saved in that iteration (or None); True
#: ends the run after that iteration (``stopped_by`` "reporter"). Not called for the iteration that finishes the
#: run (the budget, ``eval.stop_return``): that one is the ``Summary``'s, whose checkpoint (the final save) and
#: ``final_metrics`` a Tune trial reports once the run closed; so each report carries its own iteration's checkpoint.
Reporter = Callable[[dict[str, float], Checkpoint | None], bool]


def closing(
    session: Session | None, claim: RunClaim, discard: bool, started_ray: bool
) -> list[tuple[str, Callable[[], object]]]:
    """What an ending run closes, in order (``end_run``): the sinks and roles (also when training failed: the
    console line ends, files are closed), a new run that failed before its first iteration (nothing in it can
    be used: ``discard``), the run's lock, a Ray this run started."""
    steps: list[tuple[str, Callable[[], object]]] = []
    if session is not None:
        steps += [("closing the metrics sinks", session.sinks.close), ("ending roles", session.release)]
    if discard:
        steps.append(("removing the new run", claim.discard))
    steps += [("giving back the run's lock", claim.release), ("dropping local copies", claim.storage.close)]
    if started_ray:
        steps.append(("stopping Ray", stop_ray))
    return steps


class Trainer:
    """Trains ``config`` with shards and a learner group on Ray (or in-process: ``backend: local``).

    ``Trainer(config).train()`` starts a new run directory; ``Trainer.from_run_dir(path).train()``
    continues a run from its newest intact checkpoint. ``break_lock`` takes the run directory over
    from a process that holds its lock (one that is gone is detected without it). ``reporter``: see
    ``Reporter``. While ``train`` runs, ``session`` is its live state (roles, where the run stands).
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
        self.spaces = check_env_and_model(config, new_run=resume is None)
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
        self.run_dir, self.note = (config.run_dir, None) if resume else choose_run_dir(config)
        check_run_dir(self.run_dir, resume=resume is not None)
        self.storage = open_storage(self.run_dir)
        self.checkpoints = Checkpoints(self.storage)
        identity, canonical_env = env_identity(to_dict(config.env))
        self.meta = {"identity": identity, "canonical_env": canonical_env, "model": to_dict(config.model)}
        self.meta["algo"] = config.algo.name  # every checkpoint's meta.json, beside the run state
        self.teacher = read_teacher(config, self.spaces, self.storage)  # distillation's; the run's copy on a resume
        if self.teacher is not None:
            self.meta["teacher"] = teacher_meta(config, self.teacher, resume.meta if resume else None)
        meta_json(self.meta)  # a value meta.json cannot hold fails here, not at the first save
        self.algorithm = algorithm_class(config.algo.name)
        self.plan = self.algorithm.collection(config.algo)  # None: no training shards (BC)
        self.schedule = Schedule.of(config)
        starts_new = resume is None or resume.checkpoint is None  # a resume's own checkpoint wins over init_from
        self.starts = {
            "pretrained": read_pretrained(config, self.spaces, identity) if starts_new else None,
            "demonstrations": read_demonstrations(config, self.spaces, canonical_env),
        }
        self.session: Session | None = None  # opened by ``train``

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
        resumed, point = resume_point(run_dir, config, overrides or [], force)
        return cls(resumed, address=address, resume=point, break_lock=break_lock)

    # -- the run -------------------------------------------------------------------------------

    def train(self) -> Summary:
        """Run to ``train.total_steps`` env steps, checkpoint, evaluate; a signal or a failure at any phase
        ends with a checkpoint of the last completed iteration (``Summary.stopped_by`` says why it stopped)."""
        t0 = time.perf_counter()
        self.announce()
        claim, started_ray, discard = RunClaim(self.storage, self.run_dir, self.break_lock), False, False
        failure: BaseException | None = None
        try:
            if self.resume:  # a second process on the run is refused before Ray starts
                claim.take()
            backend, started_ray = start_backend(self.config, self.address, memory_need(self.config, self.spaces))
            if not self.resume:  # the run directory is chosen and locked in one step once its roles are sure to fit
                later = () if self.config.run_dir else default_run_dirs(self.config.name, after=self.run_dir)
                moved = claim.create(later)
                if moved:  # another run took the directory since it was chosen
                    self.run_dir, self.storage = claim.run_dir, claim.storage
                    self.checkpoints = Checkpoints(self.storage)
                    print(f"raysim: {moved}", flush=True)
            with StopSignals() as signals:
                try:
                    self.session = self._open(backend, signals)
                except StopRequested as stop:  # before any iteration: nothing to save
                    print(f"\nraysim: {stop.name} before the first iteration completed: nothing to save", flush=True)
                    return Summary(
                        0, 0, 0.0, time.perf_counter() - t0, str(self.run_dir), interrupted=True, stopped_by=stop.name
                    )
                return self._run(self.session, time.perf_counter() - t0)
        except BaseException as error:
            failure = error
            discard = isinstance(error, Exception) and (self.session is None or self.session.ready.state.iteration == 0)
            raise
        finally:
            end_run(closing(self.session, claim, discard, started_ray), failure)

    def announce(self) -> None:
        """Say (once) where the run goes when its default name was taken (the CLI does it in its first line)."""
        if self.note:
            print(f"raysim: {self.note}", flush=True)
            self.note = None

    def _open(self, backend: Backend, signals: StopSignals) -> Session:
        """The session: roles, the iteration to start from (a new run's, after freezing its configs; or a
        checkpoint's, loaded into the roles), the sinks. Roles already started end if this fails."""
        cfg = self.config
        roles = create_roles(backend, cfg, self.schedule.horizon, self.spaces, self.starts, self.teacher)
        try:
            collector = Collector(backend, cfg, roles, self.plan, cfg.learner.ranks)
            if self.resume:
                ready = restore(self.resume, cfg, self.run_dir, self.checkpoints, backend, roles)
            else:
                write_snapshot(self.storage, cfg)  # a new run: its configs frozen, the task's resources exported
                ready = Ready(RunState())
            if self.teacher is not None and not self.storage.exists(TEACHER_COPY):  # a resume reads the copy
                save_teacher(self.storage, self.teacher)
            collector.reset()
            collector.generation = ready.state.shards_started  # a new shard plays episodes none before it played
            replay = ReplayLog()
            if self.algorithm.off_policy:  # a resumed run's buffers, refilled from the segments its checkpoint lists
                replay = refill(self.checkpoints, ready.saved, cfg.replay.save, roles.learner)
            resumed = self.resume is not None
            sinks = (
                SinkSet(self.sinks) if self.sinks is not None else open_sinks(cfg, self.storage, ready.state, resumed)
            )
            weights = roles.learner.get_weights()
        except BaseException:
            end_roles(backend, roles)
            raise
        run = (cfg, self.run_dir, self.checkpoints, self.meta, self.schedule.horizon)  # what the session trains
        ready_state = (ready, ready.state, weights)
        return Session(*run, backend, roles, collector, signals, sinks, *ready_state, replay=replay)

    def _run(self, s: Session, startup: float) -> Summary:
        """Iterate until a stop rule, a signal or a failure; save; then the final evaluation."""
        failure: BaseException | None = None
        if self.resume and self.schedule.budget_reached(s.ready.state):
            print(f"raysim: {nothing_to_train(self.config, s.ready.state, self.run_dir)}", flush=True)
        try:
            while (reason := self.stop_reason(s, s.ready.state)) is None:
                self._iterate_or_restart(s)
        except (StopRequested, KeyboardInterrupt) as stop:
            reason = stop.name if isinstance(stop, StopRequested) else "SIGINT"
            print(f"\nraysim: {reason}: stopping; the iteration in progress is abandoned", flush=True)
        except Exception as error:  # noqa: BLE001 - saved first, then raised as RunFailed
            reason, failure = "failed", error
        wall = s.clock.training_seconds()
        try:
            final_save(s, failure)
        except StopRequested as stop:  # it arrived during the final save, which finished first
            reason = stop.name
        report = s.solved
        evaluated = s.ready.saved is not None and self.checkpoints.score(s.ready.saved) is not None
        if reason in FINISHED and report is None and self.config.eval.episodes > 0 and not evaluated:
            try:
                report = final_evaluation(s)
            except (StopRequested, KeyboardInterrupt) as stop:
                reason = stop.name if isinstance(stop, StopRequested) else "SIGINT"
                print(f"\nraysim: {reason} during the final evaluation: it was not finished", flush=True)
        s.sinks.close()
        state, stopped = s.ready.state, reason not in FINISHED
        if stopped:
            print(f"raysim: continue with `raysim resume {self.run_dir}`", flush=True)
        done = (state.env_steps, state.iteration, wall, startup, str(self.run_dir), s.record, report)
        return Summary(*done, stopped, state.env_steps - s.first.env_steps, reason, s.ready.saved)

    def stop_reason(self, s: Session, state: RunState) -> str | None:
        """Why the run stops after ``state`` (None: it goes on): the evaluation target ``eval.stop_return``,
        the step budget, ``train.stop_after``, the reporter."""
        if s.reporter_stop:
            return "reporter"
        if s.solved is not None:
            return "solved"
        if self.schedule.budget_reached(state):
            return "budget"
        stop_after = self.config.train.stop_after
        if stop_after is not None and state.iteration >= s.first.iteration + stop_after:
            return "stop_after"
        return None

    # -- one iteration -------------------------------------------------------------------------

    def _iterate_or_restart(self, s: Session) -> None:
        """One iteration; a learner that died in any phase is restarted from the last completed iteration."""
        try:
            self._iterate(s)
        except Exception as error:
            if not (isinstance(error, InputLost) or not s.roles.learner.alive()):
                raise
            restart_learner(s, error)

    def _iterate(self, s: Session) -> None:
        """Collect, update, maybe evaluate, log; then the iteration is complete (``s.ready``); maybe save.

        A stop or a failure before the end abandons the iteration whole: the last completed one stays
        what a checkpoint describes, with its metrics rows.
        """
        cfg, roles, clock = self.config, s.roles, s.clock
        before = s.ready.state
        iteration = before.iteration + 1
        log = self.schedule.log_due(iteration)
        if cfg.shards.max:
            s.collector.grow()
        with clock.phase("time_collect"):  # the learner idles here: waiting for chunks
            plan = self.algorithm.collection_at(cfg.algo, before.env_steps)  # a schedule's (distillation's beta)
            batch = s.collector.collect(s.weights, before.version, plan)  # futures; dead shards replaced
        on_phase("collect", iteration, s)
        with clock.phase("time_update"):  # the shards collect ahead meanwhile (algo.max_policy_lag)
            result = self._update(s, batch, log, before.env_steps)
            s.weights = roles.learner.get_weights()
        result["policy_lag"] = before.version - min(batch.versions, default=before.version)  # the oldest trained on
        on_phase("update", iteration, s)
        clock.iterations += 1
        seconds = s.first.seconds + clock.training_seconds()  # the run's, continued across processes
        counters = (int(result["env_steps"]), int(result["policy_version"]), seconds, s.collector.generation)
        state = before.advanced(*counters)
        report = None
        due = eval_due(cfg, state.iteration, before.env_steps, state.env_steps)
        if due and not self.schedule.budget_reached(state):
            with clock.phase("time_eval"):  # the final evaluation comes after the final save
                report = evaluate_iteration(s, state.iteration, state.env_steps)
            state = state.scored(report.mean_return, eval_metrics(report))  # metrics for the next row
            target = cfg.eval.stop_return
            if target is not None and report.mean_return is not None and report.mean_return >= target:
                s.solved = report
        if not log and (s.solved is not None or self.schedule.budget_reached(state)):
            log = True  # the run's last iteration always logs (a stopped one leaves its window to the resume)
            result.update(roles.learner.metrics())
        if log:
            s.write_row(state, result)
            state = state.logged()
        s.ready = Ready(state, roles.learner.snapshots, list(s.collector.states))  # iteration complete
        if self.algorithm.off_policy:
            s.replay.completed(roles.learner.appended)  # saved with the next checkpoint
        if report is not None or (save_due(s) and self.stop_reason(s, state) is None):
            with clock.phase("time_checkpoint"), s.signals.deferred():  # an evaluated iteration is saved
                checkpoint = save(s)
                if report is not None:
                    self.checkpoints.record_score(checkpoint, report.mean_return)
        if log and self.reporter is not None and self.stop_reason(s, state) not in FINISHED:
            s.reporter_stop = bool(self.reporter(s.record, s.ready.saved))

    def _update(self, s: Session, batch: Collected, log: bool, env_steps: int) -> dict[str, float]:
        """The learner's update on ``batch``. Chunks lost with their node before the learner read them (no rank
        updated) are collected again by their shards' replacements, and the update runs on the whole batch."""
        while True:
            try:
                return s.roles.learner.update(batch.parts, batch.stale_chunks, log=log, env_steps=env_steps)
            except Exception as error:
                lost = cause(error)
                if not isinstance(lost, ChunksLost):
                    raise
                batch = s.collector.recollect(batch, lost)
