"""Writing run files so that a reader never sees half of one: a temporary name, then an atomic rename."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it over ``path``.

    A failed ``write`` leaves ``path`` as it was (and no temporary file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_parquet(path: str | Path, table) -> Path:
    """A ``pyarrow.Table`` as a Parquet file at ``path``, atomically."""
    import pyarrow.parquet as pq

    return write_atomically(path, lambda tmp: pq.write_table(table, tmp))
