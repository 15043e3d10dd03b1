"""Checkpoints of the last completed iteration: ``save`` during the run, ``final_save`` when it stops.

A checkpoint is written from the iteration's ready states (``Ready``: no learner needed, it may be busy
or dead), after the metrics rows it covers; a failure to save ends the run naming the newest intact
checkpoint.
"""

from __future__ import annotations

import time

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
    ready.saved = session.checkpoints.save(
        iteration,
        learner_state,
        {**ready.state.meta(), **session.meta},
        before_marker=lambda: on_phase(phase, iteration, session),
    )
    session.checkpoints.prune(session.config.checkpoint.keep_last, session.config.checkpoint.keep_abandoned)
    session.last_save = time.monotonic()
    return ready.saved


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
