"""Metric sinks: every sink receives the same plain numbers for a log step; none recomputes them.

The learner reduces its metrics and copies them to the host once per log step; the coordinator
adds its own counters (iteration, env steps, steps/s, timings) and hands one record to each sink
through a ``SinkSet``:

- ``console``: a progress bar toward the step budget, redrawn in place on a terminal; plain lines
  (no control characters) when the output is not a terminal, e.g. under ``ray job submit``;
- ``parquet``: ``metrics.parquet``, one row per log step, every column float64, columns sorted by
  name (a column that appears later is null in the earlier rows); a resumed run continues it;
- ``tensorboard``: event files under ``tb/`` (``torch.utils.tensorboard``), x axis the env steps.

A sink that fails is reported once on stderr, naming it, and keeps being offered every later
record; the other sinks still get every record. The Parquet sink keeps every row in memory and
rewrites the whole file at each log step, so a failed write loses nothing: the next write (or
``close``) retries it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from raysim.config import SINKS
from raysim.storage import write_parquet

Record = dict[str, float]

CONSOLE_KEYS = ("episode_return", "pg_loss", "v_loss", "kl", "entropy", "approx_kl")


class ConsoleSink:
    """Live progress: an in-place progress bar on a terminal, one plain line per log step otherwise.

    ``live``: redraw in place (``\\r``); default: when ``stream`` is a terminal. Plain lines carry no
    control characters, so ``ray job submit`` logs and pipes stay readable.
    """

    name = "console"

    def __init__(self, total_steps: int, stream: TextIO | None = None, live: bool | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty())
        self.live = live
        self.drawn = False

    def write(self, record: Record) -> None:
        if self.live:
            self._draw(record)
            return
        percent = 100.0 * record["env_steps"] / max(1, self.total_steps)
        parts = [
            f"iter {int(record['iteration']):>4}",
            f"steps {int(record['env_steps']):>9,}/{self.total_steps:,} ({percent:5.1f}%)",
            f"{record['steps_per_s']:>9,.0f} steps/s",
        ]
        parts += [f"{k} {record[k]:.4g}" for k in CONSOLE_KEYS if k in record]
        print(" | ".join(parts), file=self.stream, flush=True)

    def _draw(self, record: Record) -> None:
        """The bar, redrawn over the previous one; cut to the terminal's width (a wrapped line cannot be redrawn)."""
        fraction = min(1.0, max(0.0, record["env_steps"] / max(1, self.total_steps)))
        width = 24
        filled = int(round(fraction * width))
        parts = [
            f"[{'#' * filled}{'-' * (width - filled)}] {100 * fraction:5.1f}%",
            f"{int(record['env_steps']):,}/{self.total_steps:,} steps",
            f"{record['steps_per_s']:,.0f} steps/s",
        ]
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
    """``metrics.parquet``: one row per log step, rewritten atomically at each step.

    Every column is float64 and the columns are sorted by name, so the schema does not depend on
    the order in which metrics first appear; a metric missing from a row is null there. A resumed
    run continues the same file: rows up to the resumed iteration are kept, later ones (logged
    after the checkpoint the run resumed from) are dropped. Every row stays in memory, so a failed
    write is retried by the next one and by ``close``.
    """

    name = "parquet"

    def __init__(self, path: str | Path, keep_until: int = 0):
        self.path = Path(path)
        self.rows: list[Record] = []
        self.dirty = False
        if keep_until and self.path.exists():
            rows = pq.read_table(self.path).to_pylist()
            self.rows = [r for r in rows if (r.get("iteration") or 0) <= keep_until]

    def write(self, record: Record) -> None:
        self.rows.append({k: float(v) for k, v in record.items()})
        self.dirty = True
        self.flush()

    def flush(self) -> None:
        columns = sorted({k for row in self.rows for k in row})
        write_parquet(
            self.path, pa.table({k: pa.array([row.get(k) for row in self.rows], pa.float64()) for k in columns})
        )
        self.dirty = False

    def close(self) -> None:
        if self.dirty:
            self.flush()

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from ``iteration``: the rows after it are dropped (they will be logged again)."""
        self.rows = [r for r in self.rows if (r.get("iteration") or 0) <= iteration]
        self.flush()


class TensorBoardSink:
    """TensorBoard event files in ``log_dir`` (the run's ``tb/``); every metric against the env steps.

    A resumed run passes ``purge_step`` (its env steps + 1): TensorBoard then hides the events a
    previous process logged after the checkpoint the run resumed from.
    """

    name = "tensorboard"

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # torch's writer needs the tensorboard package
            raise ImportError(
                f"the tensorboard package is not importable ({error}); pip install tensorboard"
            ) from error
        self.log_dir, self.SummaryWriter = str(log_dir), SummaryWriter
        self.writer = SummaryWriter(self.log_dir, purge_step=purge_step or None)

    def write(self, record: Record) -> None:
        step = int(record["env_steps"])
        for key, value in record.items():
            if key not in ("env_steps", "iteration"):
                self.writer.add_scalar(tag(key), value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from ``env_steps``: TensorBoard hides the events logged after them."""
        self.writer.close()
        self.writer = self.SummaryWriter(self.log_dir, purge_step=env_steps + 1)


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
    reported on ``errors`` (stderr) the first time, naming it, and is still offered every later
    record (a transient failure recovers). ``failures`` counts the records each sink failed on.
    """

    def __init__(self, sinks: list[Any], errors: TextIO | None = None):
        self.sinks = [(sink_name(s), s) for s in sinks]
        self.errors = errors
        self.failures: dict[str, int] = {}
        self.closed = False

    def write(self, record: Record) -> None:
        for name, sink in self.sinks:
            try:
                sink.write(dict(record))
            except Exception as error:  # noqa: BLE001 - reported once; the other sinks go on
                self.failed(name, "write", error)

    def rewind(self, iteration: int, env_steps: int) -> None:
        """The run continues from an earlier iteration (a learner restarted from an older checkpoint):
        every sink that keeps rows drops those after it, so each log step appears once."""
        for name, sink in self.sinks:
            rewind = getattr(sink, "rewind", None)
            if rewind is not None:
                try:
                    rewind(iteration, env_steps)
                except Exception as error:  # noqa: BLE001 - reported once; the other sinks go on
                    self.failed(name, "rewind", error)

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
        if first:
            others = [n for n, _ in self.sinks if n != name]
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
    run_dir: str | Path,
    total_steps: int,
    keep_until: int = 0,
    env_steps: int = 0,
    errors: TextIO | None = None,
) -> SinkSet:
    """The sinks of ``train.sinks`` for ``run_dir`` (a resumed run: ``keep_until`` its iteration and
    ``env_steps``). A sink that cannot be created is reported once on stderr and left out."""
    run_dir = Path(run_dir)
    factories = {
        "console": lambda: ConsoleSink(total_steps),
        "parquet": lambda: ParquetSink(run_dir / "metrics.parquet", keep_until=keep_until),
        "tensorboard": lambda: TensorBoardSink(run_dir / "tb", purge_step=env_steps + 1 if env_steps else None),
    }
    sinks = []
    for name in names:
        if name not in factories:
            raise ValueError(f"unknown metrics sink {name!r}; valid: {list(SINKS)}")
        try:
            sinks.append(factories[name]())
        except Exception as error:  # noqa: BLE001 - reported, the run goes on with the other sinks
            print(
                f"raysim: metrics sink {name!r} could not be created: {type(error).__name__}: {error}; "
                f"training goes on with {', '.join(n for n in names if n != name) or 'no sink'}",
                file=errors or sys.stderr,
                flush=True,
            )
    return SinkSet(sinks, errors)
