"""``PhaseClock``: the seconds an iteration spends in each phase, for the metrics (``time_collect``, ...)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("time_collect", "time_update", "time_eval", "time_checkpoint")  # seconds per iteration, by phase


class PhaseClock:
    """Seconds spent per phase since the last log step (``PHASES``), and evaluation time overall."""

    def __init__(self):
        self.start = time.perf_counter()
        self.eval_total = 0.0
        self.times = dict.fromkeys(PHASES, 0.0)  # seconds per phase since the last reset
        self.iterations = 0  # iterations since the last reset

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
