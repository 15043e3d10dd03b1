"""``RunLock``: the lock of a run directory (``lock.json``), held by the one process that trains the run."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from raysim.storage.base import RunStorage, StorageError


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
