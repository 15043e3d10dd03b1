"""Run storage: the files of a run directory, on a local path or any ``pyarrow.fs`` filesystem.

``open_storage(location)`` is the one way the coordinator (the only role that touches run storage)
reads and writes a run: checkpoints, the config snapshot and task resources, metrics and evaluation
records, the lock. ``location`` is a local path or a URI (``s3://bucket/prefix``, ``gs://...``,
``hdfs://...``); paths inside it are relative (``checkpoints/12/state.pt``).
"""

from raysim.storage.base import LeaseLostError, RunStorage, Staging, StorageError, is_uri
from raysim.storage.local import LocalStorage, fsync_dir, unwritable, write_parquet
from raysim.storage.lock import RunLock, RunLockedError
from raysim.storage.remote import FsStorage


def open_storage(location: str) -> RunStorage:
    """The storage of the run at ``location``: a local directory, or a ``pyarrow.fs`` URI."""
    return FsStorage(str(location)) if is_uri(str(location)) else LocalStorage(location)


__all__ = ["FsStorage", "LeaseLostError", "LocalStorage", "RunLock", "RunLockedError", "RunStorage", "Staging",
           "StorageError", "fsync_dir", "is_uri", "open_storage", "unwritable", "write_parquet"]  # fmt: skip
