"""``RunLock``: the lock of a run directory (``lock.json``), held by the one process that trains the run."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from raysim.storage.base import RunLockedError, RunStorage
from raysim.storage.leasefile import Observed, lease_file

LEASE_SECONDS = 120.0
LOST_EXIT_CODE = 1  # the process whose lock another process took over
RENEWED_AGO = "renewed_ago"  # in ``RunLock.holder()``: seconds since the last renewal, by the storage's clock


class RunLock:
    """The lock of a run directory (``lock.json``): held by the one process that trains it.

    A lease: the holder renews it every ``lease / 4`` seconds (a background thread). A lock whose holder is
    gone is broken (``stale``), and ``acquire(force=True)`` breaks any lock (``--break-lock``). Taking a lock
    over is one compare-and-swap of the lock file (``LeaseFile``: atomic on local filesystems and on S3), so of
    processes racing to break one lock exactly one wins and the others are refused, naming it. A renewal is a
    compare-and-swap too: when it finds that another process took the lock over (``--break-lock``, or this
    process stalled past its lease), the process ends at once with one line saying so (exit code 1), not
    through the signal path, which would save a checkpoint into a run it no longer owns.
    """

    FILE = "lock.json"

    def __init__(self, storage: RunStorage, lease: float = LEASE_SECONDS):
        self.storage, self.lease = storage, lease
        self.file = lease_file(storage, self.FILE)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self.since = time.time()
        self._version: str | bytes | None = None  # of the lock file as this process last wrote it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _content(self) -> bytes:
        holder = {**this_process(), "token": self.token, "since": self.since, "renewed": time.time()}
        return json.dumps({**holder, "lease_seconds": self.lease}).encode()

    def holder(self) -> dict | None:
        """Who holds the lock, with ``renewed_ago`` (None: nobody; ``{...}`` without a pid: an unreadable lock)."""
        observed = self.file.read()
        return None if observed is None else record(observed)

    def acquire(self, force: bool = False) -> str | None:
        """Take the lock; returns a note when a stale (or, with ``force``, any) lock was broken."""
        note = None
        self.since = time.time()
        observed = self.file.read()
        if observed is None:
            self._version = self.file.create(self._content())
        else:
            holder = record(observed)
            why = stale(holder, self.lease)
            if why is None and not force:
                raise self._refusal(holder, "is in use by")
            self._version = self.file.replace(self._content(), observed.version)
            note = f"broke the lock of process {holder.get('pid')} on host {holder.get('host')!r} ({why or 'forced'})"
        if self._version is None:  # another process created the lock, or took it over, first
            raise self._refusal(self.holder() or {}, "was locked just now by")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="raysim-run-lock", daemon=True)
        self._thread.start()
        return note

    def _refusal(self, holder: dict, what: str) -> RunLockedError:
        return RunLockedError(
            f"run directory {self.storage.path()} {what} process {holder.get('pid')} on host {holder.get('host')!r} "
            f"(since {time.ctime(holder.get('since', 0))}); wait for it to end, or pass --break-lock if that "
            "process is gone"
        )

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 4):
            try:
                self._renew_once()
            except Exception:  # the storage cannot be reached now: the next renewal retries
                continue

    def _renew_once(self) -> None:
        version = self.file.replace(self._content(), self._version)
        if version is None:
            observed = self.file.read()
            if observed is None:  # removed by hand: no other process holds it, this one still does
                version = self.file.create(self._content())
            elif record(observed).get("token") == self.token:  # a renewal whose answer was lost
                version = self.file.replace(self._content(), observed.version)
            if version is None:
                self._lost(observed or self.file.read())
        self._version = version

    def _lost(self, observed: Observed | None) -> None:
        """Another process took the run over: stop at once, writing nothing more (no checkpoint, no sink)."""
        holder = record(observed) if observed is not None else {}
        sys.stdout.flush()
        print(
            f"raysim: error: run directory {self.storage.path()} was taken over by process {holder.get('pid')} on "
            f"host {holder.get('host')!r}: this process lost its lock and stops now, writing nothing more",
            file=sys.stderr,
            flush=True,
        )
        os._exit(LOST_EXIT_CODE)

    def clear_run(self) -> bool:
        """Remove every file of the run directory but the lock, only while this process holds it (False: it
        does not, and nothing was removed)."""
        if self._version is None or (self.holder() or {}).get("token") != self.token:
            return False
        for name in self.storage.list(""):
            if name != self.FILE:
                self.storage.remove(name)
        return True

    def release(self) -> None:
        """Give the lock back (nothing when this process does not hold it)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        if self._version is not None:
            self.file.delete(self._version)  # only as this process last wrote it
            self._version = None


def record(observed: Observed) -> dict:
    """The holder a lock file names, with ``renewed_ago`` from the storage's clock (``{...}``: unreadable)."""
    try:
        holder = json.loads(observed.data)
    except ValueError:
        holder = None
    return {**(holder if isinstance(holder, dict) else {}), RENEWED_AGO: observed.age}


def stale(holder: dict, lease: float) -> str | None:
    """Why a lock is stale (its holder is gone), or None when it may still be held.

    On the same machine (host, boot and pid namespace as recorded) its holder is gone when its pid no longer
    exists or now runs a process started at another time (pids are reused, e.g. after a container restart);
    anywhere, when its lease expired by the storage's clock (``renewed_ago``).
    """
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return "unreadable lock"
    if same_machine(holder):
        gone = process_gone(pid, holder.get("started"))
        if gone:
            return gone
    age = holder.get(RENEWED_AGO)
    if not isinstance(age, (int, float)):  # a storage that does not say when the file was written: the holder's clock
        renewed = holder.get("renewed")
        age = time.time() - renewed if isinstance(renewed, (int, float)) else None
    seconds = holder.get("lease_seconds", lease)
    if age is not None and isinstance(seconds, (int, float)) and age > seconds:
        return f"its lease expired {age - seconds:.0f} s ago"
    return None


def this_process() -> dict:
    """Who this process is: its host, the boot and pid namespace its pid belongs to, its pid and start time."""
    return {
        "host": socket.gethostname(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": _pid_namespace(),
        "pid": os.getpid(),
        "started": process_start(os.getpid()),
    }


def same_machine(holder: dict) -> bool:
    """Whether the holder's pid names a process this process can see (what it did not record is not compared)."""
    here = this_process()
    return holder.get("host") == here["host"] and all(
        holder.get(key) is None or holder.get(key) == here[key] for key in ("boot_id", "pid_namespace")
    )


def process_gone(pid: int, started: int | None) -> str | None:
    """Why process ``pid`` (started at ``started`` clock ticks after boot, if known) is gone, or None."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} no longer exists"
    except PermissionError:
        pass  # another user's process: it exists
    now = process_start(pid)
    if started is not None and now is not None and now != started:
        return f"process {pid} no longer exists (its pid was reused by a process started later)"
    return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (field 22 of /proc/<pid>/stat; None: unknown)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        return int(stat.rpartition(")")[2].split()[19]) if stat else None
    except (IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None
