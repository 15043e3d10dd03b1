"""A run's Parquet files, through its storage: the metrics rows and the evaluation records.

Metrics rows are written in parts (``metrics/part-<n>.parquet``, a new part per flush, never a growing
file rewritten at each log step) and merged when the run ends; ``read_metrics`` reads them in order,
after a single ``metrics.parquet`` where the run holds one (raysim's format before parts). A merged part
is marked as the whole run (schema metadata): reading starts from the newest such part, so a merge cut
between writing it and removing the parts it replaces (a process killed) reads every row once. Evaluation records are
one file per evaluation, ``eval/<iteration>.parquet``.
"""

from __future__ import annotations

import io
import re

import pyarrow as pa
import pyarrow.parquet as pq

from raysim.storage import RunStorage

METRICS, LEGACY_METRICS = "metrics", "metrics.parquet"
WHOLE_RUN = b"raysim.whole_run"  # schema metadata of a merged part: it holds every row logged before it
_PART = re.compile(r"^part-(\d+)\.parquet$")
_UNFINISHED = re.compile(r"^\.part-\d+\.parquet\.tmp-\d+$")  # a part whose writer died before its rename (local)

Row = dict[str, float]


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def read_table(storage: RunStorage, rel: str) -> pa.Table:
    return pq.read_table(io.BytesIO(storage.read(rel)))


def rows_table(rows: list[Row]) -> pa.Table:
    """Metrics rows as a table: every column float64, sorted by name (a column missing from a row is null)."""
    columns = sorted({k for row in rows for k in row})
    return pa.table({k: pa.array([row.get(k) for row in rows], pa.float64()) for k in columns})


def metric_parts(storage: RunStorage) -> list[tuple[int, str]]:
    """``(index, rel)`` of every metrics part, in order."""
    parts = [(int(m[1]), f"{METRICS}/{name}") for name in storage.list(METRICS) if (m := _PART.match(name))]
    return sorted(parts)


def read_metrics(storage: RunStorage) -> list[Row]:
    """Every metrics row of the run, in the order logged (one row per log step)."""
    tables = [read_table(storage, rel) for _, rel in metric_parts(storage)]
    whole = [i for i, table in enumerate(tables) if WHOLE_RUN in (table.schema.metadata or {})]
    if whole:
        tables = tables[whole[-1] :]
    elif storage.exists(LEGACY_METRICS):
        tables.insert(0, read_table(storage, LEGACY_METRICS))
    rows = [row for table in tables for row in table.to_pylist()]
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def write_metrics(storage: RunStorage, rows: list[Row]) -> None:
    """Replace every metrics part (and a legacy file) by one part holding ``rows``, marked as the whole run; the
    unfinished writes a killed process left are removed with them."""
    old = metric_parts(storage)
    table = rows_table(rows).replace_schema_metadata({WHOLE_RUN: b"1"})
    storage.write(f"{METRICS}/part-{(old[-1][0] + 1) if old else 0:06d}.parquet", parquet_bytes(table))
    for _, rel in old:
        storage.remove(rel)
    storage.remove(LEGACY_METRICS)
    for name in storage.list(METRICS):  # never read; only a holder of the run's lock merges, so no live writer
        if _UNFINISHED.match(name):
            storage.remove(f"{METRICS}/{name}")


def append_metrics(storage: RunStorage, rows: list[Row]) -> None:
    """``rows`` as one more part."""
    old = metric_parts(storage)
    storage.write(f"{METRICS}/part-{(old[-1][0] + 1) if old else 0:06d}.parquet", parquet_bytes(rows_table(rows)))


def records_table(records: list[dict]) -> pa.Table:
    """Evaluation records (scalars per counted episode) as a table."""
    columns = list(dict.fromkeys(k for record in records for k in record)) or [
        "row",
        "episode",
        "seed",
        "return",
        "length",
    ]
    return pa.table({k: [record.get(k) for record in records] for k in columns})


def write_evaluation(storage: RunStorage, iteration: int, records: list[dict]) -> None:
    storage.write(f"eval/{iteration}.parquet", parquet_bytes(records_table(records)))
