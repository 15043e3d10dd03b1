"""Checkpoints of the last completed iteration: ``save`` during the run, ``final_save`` when it stops; ``end_run``:
what a run closes as it ends.

A checkpoint is written from the iteration's ready states (``Ready``: no learner needed, it may be busy
or dead), after the metrics rows it covers; a failure to save ends the run naming the newest intact
checkpoint. A failure while closing never hides the one that ended the run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from raysim.actors import describe
from raysim.checkpoint import Checkpoint, CheckpointError
from raysim.coordinator.faults import on_phase
from raysim.coordinator.session import Session
from raysim.coordinator.signals import StopRequested


class RunFailed(RuntimeError):
    """Training failed mid-run; its last completed iteration was saved first (the message says how to resume)."""


def save(session: Session, final: bool = False) -> Checkpoint:
    """A checkpoint of the session's last completed iteration (once: a saved one is returned); pruned to
    ``checkpoint.keep_last``."""
    ready = session.ready
    if ready.saved is not None:
        return ready.saved
    learner_state = ready.fetch(session.backend)
    session.sinks.flush()  # the metrics rows the checkpoint covers are written first
    iteration = ready.state.iteration
    phase = "final_save" if final else "save"
    replay = session.config.replay
    listing = session.replay.write(session.storage, session.backend, replay.capacity) if replay.save else None
    ready.saved = session.checkpoints.save(
        iteration,
        learner_state,
        {**ready.state.meta(), **session.meta},
        before_marker=lambda: on_phase(phase, iteration, session),
        replay=listing,
    )
    if listing is not None:
        session.replay.saved(listing)
    session.checkpoints.prune(session.config.checkpoint.keep_last, session.config.checkpoint.keep_abandoned)
    session.last_save = time.monotonic()
    return ready.saved


def save_due(session: Session) -> bool:
    """Every ``checkpoint.every`` iterations and every ``checkpoint.every_seconds`` of wall time."""
    cfg = session.config.checkpoint
    by_iterations = bool(cfg.every) and session.ready.state.iteration % cfg.every == 0
    by_time = bool(cfg.every_seconds) and time.monotonic() - session.last_save >= cfg.every_seconds
    return by_iterations or by_time


def final_save(session: Session, failure: BaseException | None) -> None:
    """Save the last completed iteration (a signal meanwhile waits for it, then is raised); after a
    ``failure``, raise it as ``RunFailed``, saying how to resume. A failed save is ``RunFailed`` too."""
    state, run_dir = session.ready.state, session.run_dir
    if state.iteration == 0:
        if failure is not None:
            raise RunFailed(f"{describe(failure)}\n(no iteration had completed: nothing was saved)") from failure
        return
    stop = None
    try:
        with session.signals.deferred():
            checkpoint = save(session, final=True)
    except StopRequested as caught:
        stop = caught
    except Exception as error:
        cause = f"{describe(failure)}\nand saving" if failure is not None else "saving"
        raise RunFailed(
            f"{cause} iteration {state.iteration} failed: {describe(error)}\n"
            f"{newest_intact(session)}; after fixing the cause: raysim resume {run_dir}"
        ) from error
    print(
        f"raysim: saved iteration {state.iteration} ({state.env_steps:,} env steps): "
        f"{session.storage.path(checkpoint.rel)}",
        flush=True,
    )
    if failure is not None:
        raise RunFailed(
            f"{describe(failure)}\nthe last completed iteration ({state.iteration}) "
            f"is saved; after fixing the cause: raysim resume {run_dir}"
        ) from failure
    if stop is not None:
        raise stop


def newest_intact(session: Session) -> str:
    """Where the run's newest intact checkpoint is, as a clause of a message."""
    try:
        checkpoint = session.checkpoints.newest_intact(False)[0]
    except CheckpointError:
        return "there is no intact checkpoint"
    return f"the newest intact checkpoint is {session.storage.path(checkpoint.rel)}"


def end_run(steps: list[tuple[str, Callable[[], object]]], failure: BaseException | None) -> None:
    """Run every closing step of an ending run (``(what it does, step)``), each even when one before it failed.
    While ``failure`` (what ended the run) propagates, a step's failure is said in one line and the run still ends
    with ``failure``'s own message; with none, a step's failure ends it (``RunFailed``: everything was saved)."""
    problems = []
    for what, step in steps:
        try:
            step()
        except Exception as error:  # noqa: BLE001 - every step runs; what failed is said below
            problems.append((what, error))
    if not problems:
        return
    said = "; ".join(f"{what} failed: {describe(error)}" for what, error in problems)
    if failure is None:
        raise RunFailed(f"the run ended, then {said}") from problems[0][1]
    print(f"raysim: while the run ended, {said}", file=sys.stderr, flush=True)
