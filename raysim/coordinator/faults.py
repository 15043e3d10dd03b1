"""Hooks at the trainer's named phases, for tests that inject faults; production code registers none.

    with faults.registered(hook):          # hook(phase, iteration, session)
        Trainer(config).train()

``on_phase`` runs every registered hook, in the driver, at these points of iteration ``iteration``:
``collect`` (its chunks collected), ``update`` (its update done), ``eval`` (before an evaluation of its
weights), ``save`` (its checkpoint's files written, the completion marker not yet), and at the end of
the run ``final_save`` (as ``save``) and ``final_eval`` (before the final evaluation, then ``eval``).
A hook may raise, signal or kill the process, or end roles of the ``session`` it is given (a learner
killed through ``session.backend``); what it raises propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raysim.coordinator.session import Session

PhaseHook = Callable[[str, int, "Session"], None]

_hooks: list[PhaseHook] = []  # registered by tests only


def register(hook: PhaseHook) -> None:
    """Run ``hook`` at every phase of every run in this process until ``unregister(hook)``."""
    _hooks.append(hook)


def unregister(hook: PhaseHook) -> None:
    """Stop running ``hook`` (registered with ``register``)."""
    _hooks.remove(hook)


@contextmanager
def registered(hook: PhaseHook) -> Iterator[None]:
    """``hook`` registered while the block runs."""
    register(hook)
    try:
        yield
    finally:
        unregister(hook)


def on_phase(phase: str, iteration: int, session: Session) -> None:
    """The trainer reached ``phase`` of ``iteration``: run the registered hooks (none in production)."""
    for hook in list(_hooks):
        hook(phase, iteration, session)
