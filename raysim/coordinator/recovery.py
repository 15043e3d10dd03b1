"""Continuing a run: resuming it from its newest intact checkpoint, restarting a learner that died, rewinding.

    config, point = resume_point(run_dir)              # Trainer.from_run_dir
    ready = restore(point, config, run_dir, checkpoints, backend, roles)   # a resumed run's start
    restart_learner(session, error)                     # the loop, when the learner died

Invariant: a checkpoint defines the run's timeline. Whatever a run continues from (a checkpoint, the
last completed iteration), the checkpoints, metrics rows and evaluation records of later iterations
belong to an abandoned timeline and are retired before the run writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysim.actors import Backend
from raysim.algos import algorithm_class
from raysim.checkpoint import ABANDONED, ROOT, Checkpoint, CheckpointError, Checkpoints, NoIntactCheckpoint
from raysim.config import Config, ConfigError, load_resume_config, to_dict
from raysim.coordinator.roles import Roles, create_learner
from raysim.coordinator.run_state import RunState
from raysim.coordinator.session import Ready, Session
from raysim.coordinator.snapshot import SNAPSHOT, changed_settings, resume_refusal, write_snapshot
from raysim.identity import checkpoint_identity, differences, env_identity
from raysim.rollout import EnvShard
from raysim.storage import RunStorage, is_uri, open_storage

VIDEOS = "videos"  # the run's folder of evaluation videos (``eval.video``)


@dataclass
class ResumePoint:
    """Where a resumed run continues: the checkpoint and its counters (no checkpoint: the run starts over)."""

    checkpoint: Checkpoint | None
    state: dict[str, Any]
    meta: dict[str, Any]
    force: bool = False  # the env differs from the checkpoint's and the user insisted
    new_config: bool = False  # the config differs from the run's snapshot (a sweep's mutated hyperparameters)
    changed: list[str] = field(default_factory=list)  # settings a resume's --set changed: kept in the snapshot


def resume_point(
    run_dir: str | Path, config: str | Path | None, overrides: list[str], force: bool
) -> tuple[Config, ResumePoint]:
    """The config that continues ``run_dir`` and where it continues (see ``Trainer.from_run_dir``).

    Raises ``ConfigError`` for a model or algorithm that differs from the checkpoint's, and for an env
    that does unless ``force``.
    """
    run_dir = str(run_dir) if is_uri(str(run_dir)) else str(Path(run_dir).resolve())
    storage = open_storage(run_dir)
    checkpoints = Checkpoints(storage)
    start_over = not checkpoints.complete() and storage.exists(SNAPSHOT)  # stopped before its first checkpoint
    if not start_over:
        try:
            checkpoint, state, meta = checkpoints.newest_intact()
        except NoIntactCheckpoint as error:
            raise NoIntactCheckpoint(f"{error}\n{next_steps_without_checkpoint(storage)}") from None
    root = storage.local_copy("configs", "resources")
    resumed = load_resume_config(root, config, overrides)
    resumed.run_dir = run_dir
    changed = changed_settings(load_resume_config(root, config, []), resumed) if overrides else []
    if start_over:
        return resumed, ResumePoint(None, {}, {}, changed=changed)
    refusal = resume_refusal(meta, resumed)
    if refusal:
        raise ConfigError(f"cannot resume {run_dir}: {refusal}")
    identity, canonical = env_identity(to_dict(resumed.env))
    saved, saved_canonical = checkpoint_identity(meta)  # in the current form, for checkpoints of any version
    if identity != saved:
        lines = differences(saved_canonical, canonical)
        message = "the env differs from the checkpoint's:\n  " + "\n  ".join(lines or ["(no canonical config saved)"])
        if not force:
            raise ConfigError(f"cannot resume {run_dir}: {message}\nPass --force to resume anyway.")
        print(f"raysim: WARNING: resuming with --force although {message}", flush=True)
    return resumed, ResumePoint(checkpoint, state, meta, force=identity != saved, changed=changed)


def next_steps_without_checkpoint(storage: RunStorage) -> str:
    """What a user can do with a run whose every checkpoint is damaged, as one line."""
    abandoned = storage.list(f"{ROOT}/{ABANDONED}")
    folder = storage.path(f"{ROOT}/{ABANDONED}")
    older = (
        f"move one of the {len(abandoned)} checkpoint(s) of abandoned timelines in {folder} back into "
        f"{storage.path(ROOT)}/ and resume from it; "
        if abandoned
        else ""
    )
    return (
        f"to go on: put back a copy of the damaged file(s); {older}or start the run over from its configs: "
        f"raysim train {storage.path(SNAPSHOT)} --run-dir NEW_DIR "
        "(checkpoint.keep_last > 1 keeps older ones to fall back on)"
    )


def restore(
    point: ResumePoint, config: Config, run_dir: str, checkpoints: Checkpoints, backend: Backend, roles: Roles
) -> Ready:
    """Load ``point``'s checkpoint into every learner rank and into the shards; the iteration it completed.

    The roles are loaded before anything is written, so a restore that fails leaves the run's files as they were;
    then later checkpoints and records are retired and the run's config takes the resume's settings. A run without
    a checkpoint (stopped before its first one) starts over from its configs.
    """
    storage = checkpoints.storage
    if point.checkpoint is None:
        print(f"raysim: {run_dir} has no checkpoint: starting the run over from its configs", flush=True)
        storage.remove("tb")  # the records of the process that stopped go (metrics: with the sinks)
    else:
        how = load_roles(backend, roles, point.state)
    state = RunState.from_checkpoint(point.meta, point.state) if point.checkpoint else RunState()
    abandon_after(checkpoints, state.iteration)
    if point.force or point.new_config or point.changed:  # the run's own snapshot: what it now trains with
        write_snapshot(storage, config)
    if point.changed:
        print(f"raysim: the run's config {storage.path(SNAPSHOT)} now keeps {', '.join(point.changed)}")
    if point.checkpoint is None:
        return Ready(state)
    shards = f"; shards continue {how}" if roles.shards else ""  # none: an algorithm without shards (BC)
    print(
        f"raysim: resuming {run_dir} from {storage.path(point.checkpoint.rel)} "
        f"(iteration {state.iteration}, {state.env_steps:,} env steps){shards}",
        flush=True,
    )
    return Ready(state, loaded=point.state, saved=point.checkpoint)


def load_roles(backend: Backend, roles: Roles, state: dict[str, Any]) -> str:
    """Every learner rank and every shard from a checkpoint's state; how the shards continue (another shard
    count: every shard starts fresh episodes, keyed by the policy version the run continues from; so does a
    shard whose state was lost with its node before the save: ``Ready.fetch``)."""
    roles.learner.load_state(state)
    saved, key = state.get("shards") or [], int(state["version"])
    if saved and len(saved) == len(roles.shards):
        calls = [
            s.call(EnvShard.set_state, part) if part is not None else s.call(EnvShard.start_fresh, key)
            for s, part in zip(roles.shards, saved, strict=True)
        ]
        modes = [m or "fresh episodes (its state was lost with its node)" for m in backend.get(calls)]
        return "exactly" if all(m == "exact" for m in modes) else "; ".join(sorted(set(modes)))
    backend.get([s.call(EnvShard.start_fresh, key) for s in roles.shards])
    return f"with fresh episodes ({len(saved or [])} shards saved, {len(roles.shards)} now)"


def restart_learner(session: Session, error: Exception) -> None:
    """A new learner group from the last completed iteration's ready state, else the newest checkpoint.

    Raises ``RuntimeError`` once ``learner.max_restarts`` restarts are used up.
    """
    s, cfg, roles = session, session.config, session.roles
    s.learner_restarts += 1
    if s.learner_restarts > cfg.learner.max_restarts:
        raise RuntimeError(
            f"the learner died and {cfg.learner.max_restarts} restarts are used up (learner.max_restarts): {error}"
        ) from error
    for handle in roles.learner.handles:
        s.backend.kill(handle)
    roles.learner = create_learner(s.backend, cfg, roles.spaces, s.horizon, roles.starts)
    died = f"raysim: fault: the learner died ({type(error).__name__})"
    if s.ready.state.iteration == 0:
        print(f"{died} before the first iteration completed: started a new one", flush=True)
    else:
        source, state = surviving_state(s)
        if state is None:
            print(
                f"{died} and no state of it survived: restarted it from scratch; "
                f"{s.ready.state.iteration} iteration(s) are lost",
                flush=True,
            )
            rewind(s, Ready(RunState()))
        else:
            how = load_roles(s.backend, roles, state)
            if algorithm_class(cfg.algo.name).off_policy:  # the transitions up to that iteration, in order
                roles.learner.restore_replay(s.replay.segments(s.checkpoints, s.backend))
            print(f"{died}; restarted it from {source}; shards continue {how}", flush=True)
    s.collector.reset()  # chunks in flight acted for the lost learner's future: collected anew
    s.weights = roles.learner.get_weights()


def surviving_state(session: Session) -> tuple[str, dict[str, Any] | None]:
    """The last completed iteration's ready state, or (lost with its node) the newest intact checkpoint's,
    which the session rewinds to; where it comes from. None: nothing survived."""
    try:
        return f"the last completed iteration {session.ready.state.iteration}", session.ready.fetch(session.backend)
    except Exception:  # noqa: BLE001 - the ready state was lost: fall back to storage
        pass
    try:
        checkpoint, state, meta = session.checkpoints.newest_intact()
    except CheckpointError:
        return "", None
    restored = RunState.from_checkpoint(meta, state)
    rewind(session, Ready(restored, loaded=state, saved=checkpoint))
    return f"checkpoint {session.storage.path(checkpoint.rel)} (iteration {restored.iteration})", state


def rewind(session: Session, ready: Ready) -> None:
    """Continue from an earlier iteration: checkpoints, sinks and evaluation records drop what came after it."""
    session.ready, state = ready, ready.state
    session.replay.rewound(session.checkpoints.replay_listing(ready.saved) if ready.saved else [])
    if state.iteration < session.first.iteration:
        session.first = state
    abandon_after(session.checkpoints, state.iteration)
    session.sinks.rewind(state.iteration, state.env_steps)


def abandon_after(checkpoints: Checkpoints, iteration: int) -> None:
    """The run continues from ``iteration``: the checkpoints and evaluation records of later iterations
    belong to an abandoned timeline, retired before the run writes anything (pruning sees the live one)."""
    checkpoints.retire_after(iteration)
    drop_records_after(checkpoints.storage, iteration)


def drop_records_after(storage: RunStorage, iteration: int) -> None:
    """Evaluation records and videos of iterations after ``iteration`` (an abandoned future) are removed."""
    for folder in ("eval", VIDEOS):
        for name in storage.list(folder):
            stem = name.partition(".")[0]
            if stem.isdigit() and int(stem) > iteration:
                storage.remove(f"{folder}/{name}")
