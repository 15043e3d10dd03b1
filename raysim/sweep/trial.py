"""One trial of a sweep: a raysim run in ``<experiment>/trials/<trial id>`` (``TrialRun``), which
``raysim.sweep.trainable.SweepTrial`` drives as a Ray Tune trial.

Tune hands a trial the checkpoint of one of its results back to restore it (a retry, an experiment
resumed, PBT's exploit); the trial verifies it and resumes from it exactly: from its own copy when it
is the trial's own, else (another trial's) saved into its run directory once the trial's own
checkpoints are retired. The trial's own config (a PBT mutation) wins: the learner sets its learning
rate from the config at every update.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raysim.algos import algorithm_class
from raysim.checkpoint import MANIFEST, Checkpoints, load_directory
from raysim.composition import ConfigError
from raysim.config import Config
from raysim.coordinator.snapshot import resume_refusal
from raysim.coordinator.trainer import Reporter, ResumePoint, Summary, Trainer
from raysim.storage import RunLock, RunLockedError, RunStorage, open_storage
from raysim.storage.lock import stale
from raysim.sweep.space import config_with

TRIALS = "trials"  # the experiment's folder of raysim run directories


def trial_config(base: dict, values: dict[str, Any], run_dir: str, metric: str) -> Config:
    """The run config of one trial: ``base`` with the trial's ``values``, written to ``run_dir``.

    What a sweep changes: no console sink (Tune's table is the live view); a checkpoint at every log
    step (each report hands Tune one); where the metric is an evaluation metric and the config sets no
    periodic evaluation, an evaluation at every log step (so every report carries the metric); an off-policy
    algorithm's replay buffer is not saved (``replay.save: false``: a Tune checkpoint is a checkpoint's folder
    alone, and the segments live beside the checkpoints, so a trial continued from one refills its buffer).
    """
    data = copy.deepcopy(base)
    data["run_dir"] = run_dir
    train = data.setdefault("train", {})
    train["sinks"] = [s for s in train.get("sinks", ["parquet", "tensorboard"]) if s != "console"]
    log_every = int(train.get("log_every", 1))
    data.setdefault("checkpoint", {})["every"] = log_every
    if algorithm_class((data.get("algo") or {}).get("name", "ppo")).off_policy:
        data.setdefault("replay", {})["save"] = False
    evaluation = data.setdefault("eval", {})
    if metric.startswith("eval_") and not (evaluation.get("every") or evaluation.get("every_steps")):
        evaluation["every"] = log_every
    return config_with(data, values, where=f"trial config {run_dir}")


class TrialRun:
    """One trial's raysim run, without Tune (``SweepTrial`` drives it):

        run = TrialRun(values, trial_id, base=base, experiment=experiment)  # once no live process holds its directory
        run.continue_from(folder)   # only for a checkpoint Tune handed back
        summary = run.train(reporter)

    Its run directory is ``<experiment>/trials/<trial_id>``; nothing outside it is read or written.
    """

    def __init__(self, values: dict[str, Any], trial_id: str, *, base: dict, experiment: str, metric: str):
        if not trial_id or "/" in trial_id:
            raise ValueError(f"a trial id names one folder under {TRIALS}/, got {trial_id!r}")
        run_dir = f"{experiment.rstrip('/')}/{TRIALS}/{trial_id}"
        self.config = trial_config(base, values, run_dir, metric)
        self.storage = open_storage(run_dir)
        self.resume: ResumePoint | None = None  # set by continue_from
        wait_for_handover(RunLock(self.storage), self.config.resources_timeout)

    def continue_from(self, folder: Path) -> None:
        """The run goes on from the checkpoint directory ``folder`` that Tune handed back (``take_over``)."""
        self.resume = take_over(self.storage, folder, self.config)

    def train(self, reporter: Reporter) -> Summary:
        """Train to the end, a stop rule, or a stop ``reporter`` asks for: from the handed checkpoint, else from
        scratch (``start_over`` first empties the run directory)."""
        if self.resume is None:
            start_over(self.storage)
            return Trainer(self.config, reporter=reporter).train()
        return Trainer(self.config, resume=self.resume, reporter=reporter).train()


def take_over(storage: RunStorage, folder: Path, config: Config) -> ResumePoint:
    """Where a trial continues from the checkpoint Tune handed back (``folder``): its own checkpoint (a retry; the
    restore retires the later ones), or another trial's (PBT's exploit), saved into the trial once every checkpoint
    of its own is retired: they belong to another timeline. Those changes are made under the trial's lock
    (``RunLockedError`` while a live process holds it: nothing is changed)."""
    state, meta = load_directory(folder)
    refusal = resume_refusal(meta, config)
    if refusal:
        raise ConfigError(f"trial {storage.location} cannot continue the checkpoint Tune handed it: {refusal}")
    checkpoints, iteration = Checkpoints(storage), int(meta["iteration"])
    marker = (folder / MANIFEST).read_bytes() if (folder / MANIFEST).exists() else None
    for own in (c for c in checkpoints.complete() if c.iteration == iteration and marker is not None):
        if storage.exists(f"{own.rel}/{MANIFEST}") and storage.read(f"{own.rel}/{MANIFEST}") == marker:
            return ResumePoint(own, state, meta, new_config=True)
    with locked(storage):  # the trial's checkpoints change: only while no live process holds its directory
        why = f"the trial's own, from before it took over another trial's checkpoint {iteration}"
        checkpoints.retire(checkpoints.list(), why)
        return ResumePoint(checkpoints.save(iteration, state, meta), state, meta, new_config=True)


def start_over(storage: RunStorage) -> None:
    """Delete every file in the trial's run directory ``storage`` (and nothing outside it), under its lock.

    Called only when Tune starts a trial with no checkpoint to hand back (its first start, or a retry of a
    trial that failed before its first checkpoint): whatever an earlier attempt left there belongs to no
    timeline Tune continues. While a live process holds the lock it raises ``RunLockedError`` and deletes nothing.
    """
    with locked(storage) as lock:
        lock.clear_run()


@contextmanager
def locked(storage: RunStorage) -> Iterator[RunLock]:
    """The trial's run directory locked for the body (a stale lock broken, said in a line), then released;
    ``RunLockedError`` while a live process holds it."""
    lock = RunLock(storage)
    note = lock.acquire()
    if note:
        print(f"raysim: {storage.path()}: {note}", flush=True)
    try:
        yield lock
    finally:
        lock.release()


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
