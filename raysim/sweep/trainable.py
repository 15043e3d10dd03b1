"""Ray Tune's class trainable for a sweep's trials (``SweepTrial``): each log step of a ``TrialRun`` is one result.

The trial's coordinator (``Trainer``) runs in Tune's trial actor, in a thread: it installs no signal
handlers, and its shards and learner are created inside the trial's placement group (Tune captures
the trial's child actors), so trials never oversubscribe the cluster. Every log step is one Tune
result with the checkpoint of that iteration, copied out as a self-contained directory (manifest
included) when Tune saves it.

A trial's run closes (metrics merged, actors released, lock given back) before Tune hears of its end:
its final result (the last iteration's, with the final checkpoint) comes after the run closed, and when
Tune stops a trial (a scheduler, a pause, the experiment's end) the run stops at its next log step and
the trial's actor waits for it to close.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from raysim.checkpoint import Checkpoint, copy_files
from raysim.coordinator.trainer import FINISHED
from raysim.sweep.trial import TrialRun

CLOSE_SECONDS = 120.0  # how long a trial's actor, stopped by Tune, waits for its run to close


def tune_metrics(record: dict[str, Any], carried: dict[str, float], metric: str) -> dict[str, float] | None:
    """The numeric metrics of a log step's ``record`` with the last evaluation's (``carried``, updated); None when
    ``metric`` is not among them (Tune needs it in every result). An evaluation in which no episode completed
    reports its mean return as NaN (Tune's schedulers skip it)."""
    metrics = {k: float(v) for k, v in record.items() if isinstance(v, (int, float))}
    carried.update({k: v for k, v in metrics.items() if k.startswith("eval_")})
    metrics = {**carried, **metrics}
    return metrics if metric in metrics else None


@dataclass
class Report:
    """One Tune result: a log step's metrics and the checkpoint saved with it (None: none in that iteration)."""

    metrics: dict[str, float]
    checkpoint: Checkpoint | None
    final: bool = False  # the run's last result, made after the run closed


class Handoff:
    """Reports passed one at a time from the run's thread to Tune's ``step``.

    ``offer`` waits until Tune takes the next report or stops the trial, so the checkpoint of the report Tune
    holds stays in place while Tune copies it; it returns True once the trial is stopping (the run then stops).
    ``take`` returns None once the run's thread ended (``end``) and every report was taken.
    """

    def __init__(self) -> None:
        self.reports: queue.Queue[Report | None] = queue.Queue()
        self.go_on = threading.Semaphore(0)  # released for the offer Tune's previous take answered, and by stop
        self.answered = False  # a take returned a report whose offer still waits
        self.stopping = threading.Event()

    def offer(self, report: Report) -> bool:
        if self.stopping.is_set():
            return True
        self.reports.put(report)
        if report.final:
            return True
        self.go_on.acquire()
        return self.stopping.is_set()

    def take(self) -> Report | None:
        if self.answered:
            self.go_on.release()
        report = self.reports.get()
        self.answered = report is not None and not report.final
        return report

    def end(self) -> None:
        self.reports.put(None)

    def stop(self) -> None:
        self.stopping.set()
        self.go_on.release()


class SweepTrial(tune.Trainable):
    """A sweep's trial as Tune's class trainable; Tune calls, in this order:

        setup(values, base=..., experiment=..., metric=...)   # TrialRun: waits for the run directory's handover
        load_checkpoint(folder)     # only when Tune hands a checkpoint back: the run continues from it
        step()                      # each log step's metrics; the first starts the run in a thread
        save_checkpoint(folder)     # after a step with should_checkpoint: that step's checkpoint, copied out
        cleanup()                   # the run stops at its next log step; waits (CLOSE_SECONDS) until it closed

    The last result (``done``) is the run's final metrics, after it closed, when it reached its end (``FINISHED``).
    """

    def setup(self, config: dict[str, Any], *, base: dict, experiment: str, metric: str) -> None:
        self.run = TrialRun(config, self.trial_id, base=base, experiment=experiment, metric=metric)
        self.metric = metric
        self.carried: dict[str, float] = {}  # the last evaluation's metrics, in every result after it
        self.handoff = Handoff()
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None  # what ended the run's thread, raised by the next step
        self.newest: Checkpoint | None = None  # the newest checkpoint handed to Tune
        self.last: dict[str, float] = {}  # the last result's metrics

    def load_checkpoint(self, checkpoint: str) -> None:
        self.run.continue_from(Path(checkpoint))

    def step(self) -> dict[str, Any]:
        if self.thread is None:
            self.thread = threading.Thread(target=self._train, name=f"raysim trial {self.trial_id}", daemon=True)
            self.thread.start()
        report = self.handoff.take()
        if report is None:  # the run ended without a final result (train.stop_after, or no metric): the last repeated
            if self.failure is not None:
                raise self.failure
            return {**(self.last or {self.metric: float("nan")}), "done": True}
        self.last = report.metrics
        self.newest = report.checkpoint or self.newest
        return {**report.metrics, "should_checkpoint": report.checkpoint is not None, "done": report.final}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self.newest is None:
            raise RuntimeError(f"trial {self.trial_id} has no checkpoint to hand Tune yet")
        copy_files(self.run.storage, self.newest, Path(checkpoint_dir))

    def cleanup(self) -> None:
        self.handoff.stop()
        if self.thread is not None:
            self.thread.join(CLOSE_SECONDS)

    def _train(self) -> None:
        """The run's thread: train, then (the run closed) the final result; a failure is raised by ``step``."""
        try:
            summary = self.run.train(self._report)
            if summary.stopped_by in FINISHED:
                metrics = tune_metrics(summary.final_metrics, self.carried, self.metric)
                if metrics is not None:
                    self.handoff.offer(Report(metrics, summary.checkpoint, final=True))
        except BaseException as error:  # handed to Tune by step: the trial fails, and Tune retries it
            self.failure = error
        finally:
            self.handoff.end()

    def _report(self, record: dict[str, float], checkpoint: Checkpoint | None) -> bool:
        """The run's ``Reporter``: a result for Tune; True (the run stops) once Tune stops the trial."""
        metrics = tune_metrics(record, self.carried, self.metric)
        if metrics is None:
            return self.handoff.stopping.is_set()
        return self.handoff.offer(Report(metrics, checkpoint))
