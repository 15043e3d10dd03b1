"""Metric sinks: every sink receives the same plain numbers for a log step; none recomputes them.

The learner reduces its metrics and copies them to the host once per iteration; the coordinator
adds its own counters (iteration, env steps, steps/s, timings) and hands one record to each sink.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.parquet as pq

Record = dict[str, float]

CONSOLE_KEYS = ("episode_return", "pg_loss", "v_loss", "entropy", "approx_kl")


class ConsoleSink:
    """One plain progress line per log step (safe for ``ray job submit`` logs and pipes)."""

    def __init__(self, total_steps: int, stream: TextIO | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout

    def write(self, record: Record) -> None:
        percent = 100.0 * record["env_steps"] / max(1, self.total_steps)
        parts = [
            f"iter {int(record['iteration']):>4}",
            f"steps {int(record['env_steps']):>9,}/{self.total_steps:,} ({percent:5.1f}%)",
            f"{record['steps_per_s']:>9,.0f} steps/s",
        ]
        parts += [f"{k} {record[k]:.4g}" for k in CONSOLE_KEYS if k in record]
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


class ParquetSink:
    """``metrics.parquet``: one row per log step, rewritten atomically at each step.

    A resumed run continues the same file: rows up to the resumed iteration are kept, later ones
    (logged after the checkpoint the run resumed from) are dropped.
    """

    def __init__(self, path: str | Path, keep_until: int = 0):
        self.path = Path(path)
        self.rows: list[Record] = []
        if keep_until and self.path.exists():
            rows = pq.read_table(self.path).to_pylist()
            self.rows = [r for r in rows if r.get("iteration", 0) <= keep_until]

    def write(self, record: Record) -> None:
        self.rows.append(dict(record))
        columns = sorted({k for row in self.rows for k in row})
        table = pa.table({k: pa.array([row.get(k) for row in self.rows], pa.float64()) for k in columns})
        tmp = self.path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)

    def close(self) -> None:
        pass
