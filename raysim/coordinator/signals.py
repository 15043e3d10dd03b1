"""SIGINT and SIGTERM at any phase: the run stops with a checkpoint of its last completed iteration.

``ray.init`` installs its own SIGTERM handler (``sys.exit``), so raysim installs its handlers after
Ray started, in the main thread only (a Tune trial or a notebook thread keeps its own), and puts the
previous ones back when training returns. A signal abandons the iteration in progress
(``StopRequested`` is a ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` does not
swallow it); while the final checkpoint is written, further signals wait (``deferred``). While the
driver waits in Ray, the handler only hands ``StopRequested`` over to the wait, which raises it
within a fraction of a second (``raysim.actors.HeldSignals``: Ray's C code would lose it).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from raysim.actors import held_signals

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(BaseException):
    """A stop signal arrived: the run ends after saving its last completed iteration."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The conventional status of a process ended by this signal: 130 (SIGINT), 143 (SIGTERM)."""
        return 128 + self.signum


class StopSignals:
    """raysim's SIGINT and SIGTERM handlers while a run trains (a context manager)."""

    def __init__(self):
        self.previous: dict[int, object] = {}
        self.deferring = False
        self.pending: int | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self.previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.deferring:
            if self.pending is None:
                print(
                    f"\nraysim: {signal.Signals(signum).name}: finishing the checkpoint first",
                    file=sys.stderr,
                    flush=True,
                )
            self.pending = self.pending or signum
            return
        stop = StopRequested(signum)
        if not held_signals.hold(stop):
            raise stop

    @contextmanager
    def deferred(self, stop_after: bool = True) -> Iterator[None]:
        """Signals wait until the block is done (a checkpoint being written); then the first of them stops
        the run (``stop_after``; the final save, already stopping, drops them)."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        signum, self.pending = self.pending, None
        if signum is not None and stop_after:
            raise StopRequested(signum)
