"""Run storage: the files of a run directory, written so that a reader never sees half of one.

``RunStorage`` is the one interface the coordinator writes a run through (checkpoints, snapshots,
records, the lock). Paths are relative to the run directory (``checkpoints/12/state.pt``). A
directory of files that must appear whole (a checkpoint) is written through ``staging``: its files,
then a completion marker, then ``commit``. On a local filesystem the staged directory is renamed
into place (files and directories fsynced); on a filesystem without rename (object stores) the files
are written in place and the marker, written last, is what makes them complete.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path


class StorageError(RuntimeError):
    """A run file that cannot be read or written: the message names it and says why."""


class RunStorage:
    """A run directory on the local filesystem."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, rel: str = "") -> str:
        """Where ``rel`` is, for messages."""
        return str(self.root / rel) if rel else str(self.root)

    def local(self, rel: str = "") -> Path:
        """``rel`` as a local path (for writers that need one, e.g. TensorBoard's)."""
        return self.root / rel

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        """``rel`` replaced atomically and durably: a temporary file, fsync, rename, fsync of the directory."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
            fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` with ``data`` unless it exists; False when it does (another process has it)."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(target.parent)
        return True

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def list(self, rel: str) -> list[str]:
        """The names in directory ``rel`` (none when it does not exist)."""
        folder = self.root / rel
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def remove(self, rel: str) -> None:
        """Delete the file or directory tree ``rel`` (nothing when absent)."""
        target = self.root / rel
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    def staging(self, rel: str) -> Staging:
        """Write the files of directory ``rel`` so that it appears whole on ``commit`` (``rel`` must not exist)."""
        return Staging(self.root / rel)


class Staging:
    """A directory written under a temporary name and renamed into place on ``commit``."""

    PREFIX = ".tmp-"

    def __init__(self, final: Path):
        self.final = final
        final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = final.with_name(f"{self.PREFIX}{final.name}-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()

    def write(self, name: str, data: bytes) -> None:
        with open(self.tmp / name, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def commit(self) -> None:
        fsync_dir(self.tmp)
        os.rename(self.tmp, self.final)
        fsync_dir(self.final.parent)

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in directory ``path`` durable (where the platform allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:  # some filesystems refuse fsync on a directory
        if error.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


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


class RunLockedError(StorageError):
    """The run directory is locked by another process."""


class RunLock:
    """The lock of a run directory (``lock.json``): held by the one process that trains it.

    A lease: the holder renews it every ``lease / 4`` seconds (a background thread). A lock whose
    holder is gone is broken: on the same host when its pid no longer exists, from another host when
    its lease expired. ``acquire(force=True)`` breaks any lock (``--break-lock``).
    """

    FILE = "lock.json"

    def __init__(self, storage: RunStorage, lease: float = 120.0):
        self.storage, self.lease = storage, lease
        self.token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _content(self) -> bytes:
        now = time.time()
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": self.token,
            "since": now,
            "renewed": now,
            "lease_seconds": self.lease,
        }
        return json.dumps(holder).encode()

    def holder(self) -> dict | None:
        """Who holds the lock (None: nobody, or an unreadable lock file)."""
        try:
            return json.loads(self.storage.read(self.FILE))
        except (OSError, ValueError):
            return None

    def acquire(self, force: bool = False) -> str | None:
        """Take the lock; returns a note when a stale (or, with ``force``, any) lock was broken."""
        note = None
        if not self.storage.create_exclusive(self.FILE, self._content()):
            holder = self.holder() or {}
            why = stale(holder, self.lease)
            if why is None and not force:
                raise RunLockedError(
                    f"run directory {self.storage.path()} is in use by process {holder.get('pid')} on host "
                    f"{holder.get('host')!r} (since {time.ctime(holder.get('since', 0))}); wait for it to end, or "
                    "pass --break-lock if that process is gone"
                )
            note = f"broke the lock of process {holder.get('pid')} on host {holder.get('host')!r} ({why or 'forced'})"
            self.storage.remove(self.FILE)
            if not self.storage.create_exclusive(self.FILE, self._content()):
                raise RunLockedError(f"run directory {self.storage.path()} was locked by another process just now")
        self._thread = threading.Thread(target=self._renew, name="raysim-run-lock", daemon=True)
        self._thread.start()
        return note

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 4):
            holder = self.holder()
            if holder is None or holder.get("token") != self.token:
                return  # broken by someone else: nothing to renew
            holder["renewed"] = time.time()
            try:
                self.storage.write(self.FILE, json.dumps(holder).encode())
            except OSError:
                pass  # the next renewal retries

    def release(self) -> None:
        """Give the lock back (nothing when this process does not hold it)."""
        if self._thread is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        holder = self.holder()
        if holder is not None and holder.get("token") == self.token:
            self.storage.remove(self.FILE)


def stale(holder: dict, lease: float) -> str | None:
    """Why a lock is stale (its holder is gone), or None when it may still be held."""
    if holder.get("host") == socket.gethostname():
        pid = holder.get("pid")
        if not isinstance(pid, int):
            return "unreadable lock"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} no longer exists"
        except PermissionError:
            return None
        return None
    renewed = holder.get("renewed")
    if not isinstance(renewed, (int, float)):
        return "unreadable lock"
    seconds = float(holder.get("lease_seconds", lease))
    if time.time() - renewed > seconds:
        return f"its lease expired {time.time() - renewed - seconds:.0f} s ago"
    return None
