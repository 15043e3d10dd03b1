"""Metric sinks: every sink receives the same plain numbers for a log step; none recomputes them.

The learner reduces its metrics and copies them to the host once per log step; the coordinator
adds its own counters (iteration, env steps, steps/s, timings) and hands one record to each sink
through a ``SinkSet``:

- ``console``: a progress bar toward the step budget, redrawn in place on a terminal; plain lines
  (no control characters) when the output is not a terminal, e.g. under ``ray job submit``;
- ``parquet``: ``metrics/``, one row per log step, every column float64, columns sorted by name (a
  column that appears later is null in the earlier rows); a resumed run continues it
  (``raysim.records.read_metrics`` reads it);
- ``tensorboard``: event files under ``tb/`` (``torch.utils.tensorboard``), x axis the env steps;
- ``wandb``: a Weights & Biases run (the ``wandb`` extra; not a default: it needs an account, or
  ``WANDB_MODE=offline``), x axis the env steps; the run's config once, its id kept in ``wandb.json`` so a
  resumed run continues the same W&B run, and the film of each filmed evaluation (``eval.video``).

What reaches the run directory is fenced by the run's lock (``raysim.storage``): a process that lost the run
writes nothing more. Parquet rows and ``wandb.json`` are written through the run storage; TensorBoard's events
are written to ``tb/`` while the fence is held, one record at a time (every event on disk before the fence is
let go), or on a remote run into a local folder copied to ``tb/`` through the storage; W&B's rows are handed to
W&B's own process while the fence is held, and that process writes its files (``wandb/``, and its server) itself.

A sink may also take an evaluation's film (``video``), written to the run before it is offered.

A sink that fails (also in a thread of its own, such as TensorBoard's writer) is reported once on
stderr, in one line naming it, and keeps being offered every later record; the other sinks still get
every record. The Parquet sink keeps the rows it has not written yet, so a failed write loses
nothing: the next flush (or ``close``) retries it. A sink that cannot be created is said once too; when no
sink that keeps the records is left, Parquet takes its place.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TextIO

from raysim.config import SINKS
from raysim.records import LEGACY_METRICS, append_metrics, metric_parts, read_metrics, write_metrics
from raysim.storage import RunStorage
from raysim.storage.local import naming

Record = dict[str, float]

CONSOLE_KEYS = (
    "episode_return",
    "pg_loss",
    "v_loss",
    "bc_loss",
    "distill_loss",
    "kl",
    "entropy",
    "approx_kl",
    "groups_dropped",
)
#: Said once, on its own line, the first time a record has the metric above zero: a condition to know of, not to
#: repeat on every line.
CONSOLE_NOTES = {
    "groups_filled": "dynamic sampling: a shard played algo.max_rounds rounds without finding algo.groups_per_shard "
    "groups whose returns differ; it trained on the last round's uninformative groups in the places left "
    "(groups_filled in the metrics: their fraction)",
}


class ConsoleSink:
    """Live progress: an in-place progress bar on a terminal, one plain line per log step otherwise.

    ``live``: redraw in place (``\\r``); default: when ``stream`` is a terminal. Plain lines carry no
    control characters, so ``ray job submit`` logs and pipes stay readable. ``by_iteration``: progress counts
    iterations of ``total_steps`` (a run without env steps: BC), not env steps.
    """

    name = "console"

    def __init__(
        self, total_steps: int, stream: TextIO | None = None, live: bool | None = None, by_iteration: bool = False
    ):
        self.total_steps = total_steps
        self.counter, self.unit = ("iteration", "iterations") if by_iteration else ("env_steps", "steps")
        self.stream = stream or sys.stdout
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty())
        self.live = live
        self.drawn = False
        self.noted: set[str] = set()

    def write(self, record: Record) -> None:
        for key, note in CONSOLE_NOTES.items():
            if record.get(key, 0) > 0 and key not in self.noted:
                self.noted.add(key)
                self.stream.write(("\r\x1b[K" if self.live and self.drawn else "") + f"raysim: {note}\n")
        if self.live:
            self._draw(record)
            return
        percent = 100.0 * record[self.counter] / max(1, self.total_steps)
        parts = [f"iter {int(record['iteration']):>4}"]
        if self.counter == "env_steps":
            parts += [
                f"steps {int(record['env_steps']):>9,}/{self.total_steps:,} ({percent:5.1f}%)",
                f"{record['steps_per_s']:>9,.0f} steps/s",
            ]
        else:
            parts.append(f"of {self.total_steps:,} ({percent:5.1f}%)")
        parts += [f"{k} {record[k]:.4g}" for k in CONSOLE_KEYS if k in record]
        print(" | ".join(parts), file=self.stream, flush=True)

    def _draw(self, record: Record) -> None:
        """The bar, redrawn over the previous one; cut to the terminal's width (a wrapped line cannot be redrawn)."""
        fraction = min(1.0, max(0.0, record[self.counter] / max(1, self.total_steps)))
        width = 24
        filled = int(round(fraction * width))
        parts = [
            f"[{'#' * filled}{'-' * (width - filled)}] {100 * fraction:5.1f}%",
            f"{int(record[self.counter]):,}/{self.total_steps:,} {self.unit}",
        ]
        if self.counter == "env_steps":
            parts.append(f"{record['steps_per_s']:,.0f} steps/s")
        parts += [f"{k.replace('episode_', '')} {record[k]:.4g}" for k in CONSOLE_KEYS if k in record]
        columns = shutil.get_terminal_size((120, 24)).columns
        line = " | ".join(parts)[: max(20, columns - 1)]
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.live and self.drawn:  # leave the last bar on screen; later output starts on a new line
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


class ParquetSink:
    """The run's metrics rows in Parquet (``raysim.records``): one row per log step.

    Every column is float64 and the columns are sorted by name, so the schema does not depend on
    the order in which metrics first appear; a metric missing from a row is null there. Rows are
    buffered and written as a new part every ``flush_seconds``, before every checkpoint (``flush``)
    and at the end (then the parts are merged into one). A resumed run continues the same rows: those
    up to the resumed iteration are kept, later ones (logged after its checkpoint) are dropped. A
    failed write keeps the rows for the next one.
    """

    name = "parquet"

    def __init__(self, storage: RunStorage, keep_until: int | None = None, flush_seconds: float = 10.0):
        self.storage, self.flush_seconds = storage, flush_seconds
        self.buffer: list[Record] = []
        self.flushed = time.monotonic()
        if keep_until is not None:
            self.rewind(keep_until, 0)

    def write(self, record: Record) -> None:
        self.buffer.append({k: float(v) for k, v in record.items()})
        if time.monotonic() - self.flushed >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            append_metrics(self.storage, self.buffer)
            self.buffer = []
        self.flushed = time.monotonic()

    def close(self) -> None:
        self.flush()
        if len(metric_parts(self.storage)) > 1:  # one file for the whole run
            write_metrics(self.storage, read_metrics(self.storage))

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from ``iteration``: the rows after it are dropped (they will be logged again)."""
        self.flush()
        rows = read_metrics(self.storage)
        kept = [r for r in rows if (r.get("iteration") or 0) <= iteration]
        if len(kept) < len(rows) or self.storage.exists(LEGACY_METRICS):
            write_metrics(self.storage, kept)


class TensorBoardSink:
    """TensorBoard event files in the run's ``tb/``; every metric against the env steps (``by_iteration``: against
    the iterations, for a run without env steps: BC).

    On a remote run directory the events are written to a local directory and copied to ``tb/`` at
    every ``flush`` (before checkpoints) and at the end. A resumed run passes ``purge_step`` (its env
    steps + 1): TensorBoard then hides the events a previous process logged after that checkpoint.
    """

    name = "tensorboard"

    def __init__(self, storage: RunStorage, purge_step: int | None = None, by_iteration: bool = False):
        self.counter = "iteration" if by_iteration else "env_steps"
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # torch's writer needs the tensorboard package
            raise ImportError(
                f"the tensorboard package is not importable ({error}); pip install tensorboard"
            ) from error
        self.storage, self.SummaryWriter = storage, SummaryWriter
        if storage.is_local:
            self.log_dir, self.mirror = storage.path("tb"), None
        else:
            self.mirror = tempfile.mkdtemp(prefix="raysim-tb-")
            self.log_dir = self.mirror
        self.threads: list[threading.Thread] = []
        self.writer = self._open(purge_step)

    def _open(self, purge_step: int | None) -> Any:
        """A ``SummaryWriter``; its background writer thread's failure is reported by ``SinkSet``, not as a
        traceback (``quiet_threads``)."""
        before = set(threading.enumerate())
        with self._writing():
            writer = self.SummaryWriter(self.log_dir, purge_step=purge_step or None)
            writer.flush()
        started = [t for t in set(threading.enumerate()) - before if type(t).__module__.startswith("tensorboard")]
        self.threads += quiet_threads(started)
        return writer

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The run's fence while the writer writes to the run's ``tb/`` itself (a local run: ``flush`` drains the
        writer's queue inside it; none for a local mirror, which reaches the run through the storage); a failure
        (a full disk) names the folder written."""
        with self.storage.fenced() if self.mirror is None else nullcontext(), naming(Path(self.log_dir)):
            yield

    def _raise_thread_failure(self) -> None:
        """The failure of a writer thread (e.g. a full disk, naming the folder), raised here where the sink's caller
        reports it."""
        for thread in self.threads:
            if (error := THREAD_FAILURES.get(thread)) is not None:
                with naming(Path(self.log_dir)):
                    raise error

    def write(self, record: Record) -> None:
        step = int(record[self.counter])
        with self._writing():
            for key, value in record.items():
                if key not in ("env_steps", "iteration"):
                    self.writer.add_scalar(tag(key), value, global_step=step)
            self.writer.flush()
        self._raise_thread_failure()

    def flush(self) -> None:
        if self.mirror is not None:
            with self._writing():
                self.writer.flush()
            self.storage.upload(Path(self.mirror), "tb")
        self._raise_thread_failure()

    def close(self) -> None:
        with self._writing():
            self.writer.close()
        self._raise_thread_failure()
        if self.mirror is not None:
            self.storage.upload(Path(self.mirror), "tb")
            shutil.rmtree(self.mirror, ignore_errors=True)
            self.mirror = None

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from ``env_steps`` (or ``iteration``): TensorBoard hides the events logged after them."""
        with self._writing():
            self.writer.close()
        self.writer = self._open((iteration if self.counter == "iteration" else env_steps) + 1)


#: The sinks that keep the records (the console only shows them).
KEEPS_RECORDS = ("parquet", "tensorboard", "wandb")

#: The run's W&B run, kept so that a resumed run continues it: {"id", "project", "entity"}.
WANDB_RUN = "wandb.json"


class WandbSink:
    """A Weights & Biases run: every record as one ``log`` call, as it is (the Parquet rows' keys and values),
    plotted against the env steps (``by_iteration``: the iterations, for a run without env steps: BC).

    ``config`` (the resolved config) is the W&B run's config, given once at ``wandb.init``. A new run keeps the
    W&B run's id, project and entity in ``wandb.json`` (through the run storage: also on S3); a resumed run
    finds it and continues that W&B run (``resume="allow"``; its config updated with the resumed one). The
    ``WANDB_*`` variables (``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``, ``WANDB_DIR``...) work as wandb
    defines them; W&B's files go to the run directory when it is local and ``WANDB_DIR`` is not set.

    Rows logged again (a resume from a checkpoint older than the last row, a learner restarted from an older
    checkpoint) are logged again: W&B cannot drop points (its rewind is a private preview), so it keeps the
    earlier points beside them, at the same env steps; ``metrics/`` keeps one row per log step.

    ``wandb.init``, every row and ``finish`` happen while this process holds the run (its lock's fence): a process
    that lost the run hands W&B nothing more and does not finish the W&B run, which the process that took the run
    over may have resumed. W&B's own process writes its files (``wandb/``) as it receives them: what was handed
    to it before the loss may land there just after, beyond any fence; it ends with this process.
    """

    name = "wandb"

    def __init__(self, storage: RunStorage, config: dict | None = None, by_iteration: bool = False):
        try:
            import wandb
        except ImportError as error:
            raise ImportError(f'the wandb package is not importable ({error}); pip install -e ".[wandb]"') from error
        self.storage, self.wandb = storage, wandb
        self.counter = "iteration" if by_iteration else "env_steps"
        kept = json.loads(storage.read(WANDB_RUN)) if storage.exists(WANDB_RUN) else {}
        with storage.fenced():
            self.run = wandb.init(
                id=kept.get("id"),
                resume="allow" if kept else None,
                project=kept.get("project") or None,
                entity=kept.get("entity") or None,
                name=os.environ.get("WANDB_NAME") or storage.location.rstrip("/").rsplit("/", 1)[-1],
                dir=storage.location if storage.is_local and not os.environ.get("WANDB_DIR") else None,
                config=config,
                allow_val_change=bool(kept),
            )
        try:
            self.run.define_metric("*", step_metric=self.counter)
            if not kept:
                run = {"id": self.run.id, "project": self.run.project, "entity": self.run.entity}
                storage.write(WANDB_RUN, json.dumps(run).encode())
        except BaseException:
            self.run.finish(exit_code=1)
            raise

    def write(self, record: Record) -> None:
        with self.storage.fenced():
            self.run.log(record)

    def video(self, rel: str, iteration: int, env_steps: int) -> None:
        """The film of the evaluation after ``iteration`` (``rel`` of the run) as ``eval_video``, at its env steps."""
        film = self.wandb.Video(
            io.BytesIO(self.storage.read(rel)), caption=f"iteration {iteration}", format=Path(rel).suffix[1:]
        )
        with self.storage.fenced():
            self.run.log({"eval_video": film, self.counter: iteration if self.counter == "iteration" else env_steps})

    def close(self) -> None:
        with self.storage.fenced():
            self.run.finish()


#: The failures of the threads ``quiet_threads`` took over (None while they run); their sinks raise them.
THREAD_FAILURES: weakref.WeakKeyDictionary[threading.Thread, BaseException | None] = weakref.WeakKeyDictionary()


def quiet_threads(threads: list[threading.Thread]) -> list[threading.Thread]:
    """Keep the failure of a sink's background ``threads`` for the sink to raise (``SinkSet`` reports it once,
    in one line), instead of the 30-line "Exception in thread" traceback Python prints; other threads'
    failures go to the hook that was installed before."""
    for thread in threads:
        THREAD_FAILURES[thread] = None
    if not getattr(threading.excepthook, "keeps_sink_failures", False):
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.thread is not None and args.thread in THREAD_FAILURES:
                THREAD_FAILURES[args.thread] = args.exc_value
            else:
                previous(args)

        hook.keeps_sink_failures = True
        threading.excepthook = hook
    return threads


def tag(key: str) -> str:
    """The TensorBoard tag of a metric: grouped into train/, loss/, eval/, time/."""
    if key.startswith("eval_"):
        return f"eval/{key}"
    if key.startswith("time") or key == "steps_per_s":
        return f"time/{key}"
    if key in ("pg_loss", "v_loss", "entropy", "kl", "approx_kl", "clipfrac", "grad_norm"):
        return f"loss/{key}"
    return f"train/{key}"


class SinkSet:
    """Hands each record to every sink; a failing sink is reported once and never stops the others.

    Each sink gets its own copy of the record (the same values). A sink whose ``write`` raises is
    reported on ``errors`` (stderr) the first time, naming it and the sinks that still work (those whose last
    call did not fail), and is still offered every later record (a transient failure recovers). ``failures``
    counts the records each sink failed on.
    """

    def __init__(self, sinks: list[Any], errors: TextIO | None = None):
        self.sinks = [(sink_name(s), s) for s in sinks]
        self.errors = errors
        self.failures: dict[str, int] = {}
        self.failing: set[str] = set()  # the sinks whose last write (or flush, close...) failed
        self.closed = False

    def write(self, record: Record) -> None:
        for name, sink in self.sinks:
            try:
                sink.write(dict(record))
            except Exception as error:  # noqa: BLE001 - reported once; the other sinks go on
                self.failed(name, "write", error)
            else:
                self.failing.discard(name)

    def flush(self) -> None:
        """Every sink that buffers writes what it holds (before a checkpoint: the rows it covers are durable)."""
        self._offer("flush")

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from an earlier iteration (a learner restarted from an older checkpoint):
        every sink that keeps rows drops those after it, so each log step appears once."""
        self._offer("rewind", iteration, env_steps)

    def video(self, rel: str, iteration: int, env_steps: int) -> None:
        """The film of the evaluation after ``iteration``, written to ``rel`` of the run, to every sink that shows
        videos."""
        self._offer("video", rel, iteration, env_steps)

    def _offer(self, what: str, *args: Any) -> None:
        """Call ``what`` on every sink that has it; a failure is reported once and the other sinks go on."""
        for name, sink in self.sinks:
            method = getattr(sink, what, None)
            if method is not None:
                try:
                    method(*args)
                except Exception as error:  # noqa: BLE001 - reported once; the other sinks go on
                    self.failed(name, what, error)
                else:
                    self.failing.discard(name)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for name, sink in self.sinks:
            try:
                sink.close()
            except Exception as error:  # noqa: BLE001
                self.failed(name, "close", error)

    def failed(self, name: str, what: str, error: BaseException) -> None:
        first = name not in self.failures
        self.failures[name] = self.failures.get(name, 0) + 1
        self.failing.add(name)
        if first:
            others = [n for n, _ in self.sinks if n not in self.failing]  # those that still work
            print(
                f"raysim: metrics sink {name!r} failed ({what}): {type(error).__name__}: {error}; it keeps "
                f"receiving later records, and every record still goes to {', '.join(others) or 'no other sink'} "
                f"(reported once)",
                file=self.errors or sys.stderr,
                flush=True,
            )


def sink_name(sink: Any) -> str:
    return getattr(sink, "name", None) or type(sink).__name__


def make_sinks(
    names: list[str],
    storage: RunStorage,
    total_steps: int,
    keep_until: int = 0,
    env_steps: int = 0,
    errors: TextIO | None = None,
    by_iteration: bool = False,
    config: dict | None = None,
) -> SinkSet:
    """The sinks of ``train.sinks`` for the run in ``storage`` (a resumed run: ``keep_until`` its iteration
    and ``env_steps``). A sink that cannot be created is reported once on stderr and left out; when it leaves no
    sink that keeps the records (``KEEPS_RECORDS``), Parquet takes its place. ``by_iteration``: a run without env
    steps (BC), whose progress is ``total_steps`` iterations. ``config``: the resolved config, for the sinks that
    keep it (W&B)."""
    resumed_at = keep_until if by_iteration else env_steps
    factories = {
        "console": lambda: ConsoleSink(total_steps, by_iteration=by_iteration),
        "parquet": lambda: ParquetSink(storage, keep_until=keep_until),
        "tensorboard": lambda: TensorBoardSink(
            storage, purge_step=resumed_at + 1 if resumed_at else None, by_iteration=by_iteration
        ),
        "wandb": lambda: WandbSink(storage, config=config, by_iteration=by_iteration),
    }
    for name in names:
        if name not in factories:
            raise ValueError(f"unknown metrics sink {name!r}; valid: {list(SINKS)}")
    sinks, failed = [], []
    for name in names:
        try:
            sinks.append(factories[name]())
        except Exception as error:  # noqa: BLE001 - reported, the run goes on with the other sinks
            failed.append((name, error))
    left = [sink_name(s) for s in sinks]
    if any(n in KEEPS_RECORDS for n, _ in failed) and not any(n in KEEPS_RECORDS for n in left):
        sinks.append(ParquetSink(storage, keep_until=keep_until))
        left.append(f"{'and ' if left else ''}parquet in its place (metrics/): the records are kept")
    for name, error in failed:
        print(
            f"raysim: metrics sink {name!r} could not be created: {type(error).__name__}: {error}; "
            f"training goes on with {', '.join(left) or 'no sink'}",
            file=errors or sys.stderr,
            flush=True,
        )
    return SinkSet(sinks, errors)
