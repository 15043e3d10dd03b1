"""One trial of a sweep: a raysim run inside a Ray Tune trial.

The trial's coordinator (``Trainer``) runs in Tune's trial actor, in a thread: it installs no signal
handlers, and its shards and learner are created inside the trial's placement group (Tune captures
the trial's child actors), so trials never oversubscribe the cluster. Its run directory is
``<experiment>/trials/<trial id>``. At every log step it reports the run's metrics to Tune with the
checkpoint of that iteration (copied out as a self-contained directory, manifest included); Tune
hands such a checkpoint back to restore a trial (a retry, an experiment resumed, PBT's exploit), and
the trial verifies it and resumes from it exactly: from its own copy when it is the trial's own, else
(another trial's) saved into its run directory once the trial's own checkpoints are retired. The trial's
own config (a PBT mutation) wins: the learner sets its learning rate from the config at every update.

A trial's run closes (metrics merged, actors released, lock given back) before Tune hears of its end:
its final report comes after the run closed, and when Tune stops a trial (a scheduler, the experiment's
end) the trial's actor waits for its run to close before it ends.
"""

from __future__ import annotations

import copy
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from raysim.checkpoint import MANIFEST, Checkpoint, Checkpoints, copy_files, load_directory
from raysim.composition import ConfigError
from raysim.config import Config
from raysim.coordinator.snapshot import resume_refusal
from raysim.coordinator.trainer import FINISHED, ResumePoint, Trainer
from raysim.storage import RunLock, RunLockedError, RunStorage, open_storage
from raysim.storage.lock import stale
from raysim.sweep.space import config_with

TRIALS = "trials"  # the experiment's folder of raysim run directories
CLOSE_SECONDS = 120.0  # how long a trial's actor, stopped by Tune, waits for its run to close

_stop_asked = threading.Event()  # Tune stopped this process's trial: its next report ends the run instead
_run_closed = threading.Event()  # no trial function runs in this process (none started yet, or its run closed)
_run_closed.set()


def trial_config(base: dict, values: dict[str, Any], run_dir: str, metric: str) -> Config:
    """The run config of one trial: ``base`` with the trial's ``values``, written to ``run_dir``.

    What a sweep changes: no console sink (Tune's table is the live view); a checkpoint at every log
    step (each report hands Tune one); where the metric is an evaluation metric and the config sets no
    periodic evaluation, an evaluation at every log step (so every report carries the metric).
    """
    data = copy.deepcopy(base)
    data["run_dir"] = run_dir
    train = data.setdefault("train", {})
    train["sinks"] = [s for s in train.get("sinks", ["parquet", "tensorboard"]) if s != "console"]
    log_every = int(train.get("log_every", 1))
    data.setdefault("checkpoint", {})["every"] = log_every
    evaluation = data.setdefault("eval", {})
    if metric.startswith("eval_") and not (evaluation.get("every") or evaluation.get("every_steps")):
        evaluation["every"] = log_every
    return config_with(data, values, where=f"trial config {run_dir}")


class TuneReport:
    """The trial's ``Reporter``: numeric metrics (the last evaluation carried forward) and the checkpoint.

    An evaluation in which no episode completed reports its mean return as NaN (Tune's schedulers skip it).
    """

    def __init__(self, storage: RunStorage, metric: str):
        self.storage, self.metric = storage, metric
        self.carried: dict[str, float] = {}  # the last evaluation's metrics, in every report after it

    def __call__(self, record: dict[str, float], checkpoint: Checkpoint | None) -> None:
        from ray import tune

        if _stop_asked.is_set():  # as Tune's own report would: the trial's thread ends (the run closes on the way)
            raise SystemExit(0)
        metrics = {k: float(v) for k, v in record.items() if isinstance(v, (int, float))}
        self.carried.update({k: v for k, v in metrics.items() if k.startswith("eval_")})
        metrics = {**self.carried, **metrics}
        if self.metric not in metrics:  # Tune needs the metric in every report
            return
        if checkpoint is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="raysim-tune-") as folder:
            copy_files(self.storage, checkpoint, Path(folder) / "checkpoint")
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(Path(folder) / "checkpoint")))


def take_over(storage: RunStorage, folder: Path, config: Config) -> ResumePoint:
    """Where a trial continues from the checkpoint Tune handed back (``folder``): its own checkpoint (a retry; the
    restore retires the later ones), or another trial's (PBT's exploit), saved into the trial once every checkpoint
    of its own is retired: they belong to another timeline."""
    state, meta = load_directory(folder)
    refusal = resume_refusal(meta, config)
    if refusal:
        raise ConfigError(f"trial {storage.location} cannot continue the checkpoint Tune handed it: {refusal}")
    checkpoints, iteration = Checkpoints(storage), int(meta["iteration"])
    marker = (folder / MANIFEST).read_bytes() if (folder / MANIFEST).exists() else None
    for own in (c for c in checkpoints.complete() if c.iteration == iteration and marker is not None):
        if storage.exists(f"{own.rel}/{MANIFEST}") and storage.read(f"{own.rel}/{MANIFEST}") == marker:
            return ResumePoint(own, state, meta, new_config=True)
    why = f"the trial's own, from before it took over another trial's checkpoint {iteration}"
    checkpoints.retire(checkpoints.list(), why)
    return ResumePoint(checkpoints.save(iteration, state, meta), state, meta, new_config=True)


def wait_for_handover(lock: RunLock, timeout: float) -> None:
    """Wait until no live process holds the run directory: Tune starts a paused or failed trial again in a new
    actor while the old one may still be ending (on another node: until its lease expires). A line every few
    seconds meanwhile; after ``timeout`` seconds (``resources_timeout``), ``RunLockedError``: the trial fails
    and nothing in its run directory is touched."""
    start = time.monotonic()
    deadline, said = start + timeout, start
    while (holder := lock.holder()) is not None and stale(holder, lock.lease) is None:
        who = f"process {holder.get('pid')} on host {holder.get('host')!r}"
        if time.monotonic() >= deadline:
            raise RunLockedError(
                f"run directory {lock.storage.path()} is still held by {who} after {timeout:g} s "
                "(resources_timeout): the trial's earlier attempt did not end; nothing in it was changed"
            )
        if time.monotonic() - said >= 5.0:
            print(f"raysim: waiting for {who} to hand over run directory {lock.storage.path()}", flush=True)
            said = time.monotonic()
        time.sleep(0.5)


def trial_trainable(function: Any) -> type:
    """``function`` (``run_trial`` with its parameters bound) as Tune's trainable class, whose stop waits (at
    most ``CLOSE_SECONDS``) until the trial's run closed: Tune ends the actor once its stop returned."""
    from ray.tune.trainable.function_trainable import wrap_function

    class Trial(wrap_function(function)):  # pickled by value: the events are reached through a module function
        def cleanup(self) -> None:
            stop_and_wait(super().cleanup)

    return Trial


def stop_and_wait(release_report: Any) -> None:
    """Tune stops this process's trial: its next report ends the run (as Tune's own report would);
    ``release_report`` (Tune's cleanup) lets a report in progress return; then wait for the run to close."""
    _stop_asked.set()
    release_report()
    _run_closed.wait(CLOSE_SECONDS)


def run_trial(values: dict[str, Any], *, base: dict, experiment: str, metric: str) -> None:
    """Tune's function trainable: train the trial's run from scratch, or from the checkpoint Tune hands back.

    A stop asked of an earlier trial in this process (an actor Tune reuses) does not end this one."""
    _stop_asked.clear()
    _run_closed.clear()
    try:
        _train_trial(values, base=base, experiment=experiment, metric=metric)
    finally:
        _run_closed.set()


def _train_trial(values: dict[str, Any], *, base: dict, experiment: str, metric: str) -> None:
    from ray import tune

    run_dir = f"{experiment.rstrip('/')}/{TRIALS}/{tune.get_context().get_trial_id()}"
    config = trial_config(base, values, run_dir, metric)
    storage = open_storage(run_dir)
    wait_for_handover(RunLock(storage), config.resources_timeout)
    reporter = TuneReport(storage, metric)
    handed = tune.get_checkpoint()
    if handed is None:
        start_over(storage)
        trainer = Trainer(config, reporter=reporter)
    else:
        with handed.as_directory() as folder:
            point = take_over(storage, Path(folder), config)
        trainer = Trainer(config, resume=point, reporter=reporter)
    summary = trainer.train()
    if summary.stopped_by in FINISHED:  # after the run closed: Tune may end the trial's actor on this report
        reporter(summary.final_metrics, summary.checkpoint)


def start_over(storage: RunStorage) -> None:
    """A trial started again from scratch: its earlier attempt's files go, under the run's lock (never while a
    live process holds it: ``RunLockedError``)."""
    lock = RunLock(storage)
    note = lock.acquire()
    if note:
        print(f"raysim: {storage.path()}: {note}", flush=True)
    try:
        lock.clear_run()
    finally:
        lock.release()
