"""``RunLock``: the lock of a run directory (``lock.json``), held by the one process that trains the run."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from raysim.storage.base import LeaseLostError, RunLockedError, RunStorage
from raysim.storage.leasefile import Observed, lease_file

LEASE_SECONDS = 120.0
LOST_EXIT_CODE = 1  # the process whose lock another process took over
RENEWED_AGO = "renewed_ago"  # in ``RunLock.holder()``: seconds since the last renewal, by the storage's clock
BREAK_LOCK = "wait for it to end, or pass --break-lock if that process is gone"  # what a refused resume can do


class RunLock:
    """The lock of a run directory (``lock.json``): held by the one process that trains it.

    A lease: the holder renews it every ``lease / 4`` seconds (a background thread). A lock whose holder is
    gone is broken (``stale``), and ``acquire(force=True)`` breaks any lock (``--break-lock``). Taking a lock
    over is one compare-and-swap of the lock file (``LeaseFile``: atomic on local filesystems and on S3), so of
    processes racing to break one lock exactly one wins and the others are refused, naming it. A renewal is a
    compare-and-swap too: when it finds that another process took the lock over (``--break-lock``, or this
    process stalled past its lease), or that the lock file is gone (taken over and given back: a sweep's
    ``start_over``, a discarded run), the process ends at once with one line saying so (exit code 1), not
    through the signal path, which would save a checkpoint into a run it no longer owns.

    Writes are fenced by the lease: every change through the storage the lock was taken with checks first
    that the lock file still names this process (``held``), and refuses otherwise; on a local filesystem the
    check holds a shared ``flock`` on the lock file until the change is done, so no take-over comes between.
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
        self._renewing = threading.Lock()  # held by a renewal in flight; ``release`` waits for it

    def _content(self) -> bytes:
        holder = {**this_process(), "token": self.token, "since": self.since, "renewed": time.time()}
        return json.dumps({**holder, "lease_seconds": self.lease}).encode()

    def holder(self) -> dict | None:
        """Who holds the lock, with ``renewed_ago`` (None: nobody; ``{...}`` without a pid: an unreadable lock)."""
        observed = self.file.read()
        return None if observed is None else record(observed)

    def acquire(self, force: bool = False, advice: str = BREAK_LOCK) -> str | None:
        """Take the lock; returns a note when a stale (or, with ``force``, any) lock was broken. A refusal
        (``RunLockedError``) names the holder and ends with ``advice``: what the refused command can do."""
        note = None
        self.since = time.time()
        observed = self.file.read()
        if observed is None:
            self._version = self.file.create(self._content())
        else:
            holder = record(observed)
            why = stale(holder, self.lease)
            if why is None and not force:
                raise self._refusal(holder, "is in use by", advice)
            self._version = self.file.replace(self._content(), observed.version)
            note = f"broke the lock of process {holder.get('pid')} on host {holder.get('host')!r} ({why or 'forced'})"
        if self._version is None:  # another process created the lock, or took it over, first
            raise self._refusal(self.holder() or {}, "was locked just now by", advice)
        self.storage.fence = self  # every later change through this storage checks the lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="raysim-run-lock", daemon=True)
        self._thread.start()
        return note

    def _refusal(self, holder: dict, what: str, advice: str) -> RunLockedError:
        return RunLockedError(
            f"run directory {self.storage.path()} {what} process {holder.get('pid')} on host {holder.get('host')!r} "
            f"(since {time.ctime(holder.get('since', 0))}); {advice}"
        )

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 4):
            try:
                self._renew_once()
            except Exception:  # the storage cannot be reached now: the next renewal retries
                continue

    def _renew_once(self) -> None:
        """Renew the lease. A lock file that names another process, or none (taken over and given back), is lost:
        only a file that still names this process proves that it never lost the lock."""
        with self._renewing:
            if self._stop.is_set() or self._version is None:  # given back meanwhile: nothing to renew
                return
            version = self.file.replace(self._content(), self._version)
            if version is None:
                observed = self.file.read()
                if observed is not None and record(observed).get("token") == self.token:  # an answer was lost
                    version = self.file.replace(self._content(), observed.version)
                if version is None:
                    self._version = None
                    self._lost(observed)
                    return
            self._version = version

    @contextmanager
    def held(self) -> Iterator[None]:
        """Run the body (a change to the run) only while this process holds the lock: ``LeaseLostError`` otherwise,
        after ``_lost`` when the lock was taken from it. The lock file must name this process; on a local
        filesystem a shared ``flock`` on it is held until the body ends (a take-over waits for it), elsewhere
        the check is one request just before the change."""
        if self._version is None:
            raise LeaseLostError(f"run directory {self.storage.path()} is not locked by this process: nothing written")
        with self.file.holding() as observed:
            if observed is None or record(observed).get("token") != self.token:
                self._version = None
                self._lost(observed)
                raise LeaseLostError(f"run directory {self.storage.path()} was taken over: nothing written")
            yield

    def _lost(self, observed: Observed | None) -> None:
        """Another process took the run over: stop at once, writing nothing more (no checkpoint, no sink)."""
        if observed is None:
            how = "taken over and given back by another process (its lock file is gone)"
        else:
            holder = record(observed)
            how = f"taken over by process {holder.get('pid')} on host {holder.get('host')!r}"
        sys.stdout.flush()
        print(
            f"raysim: error: run directory {self.storage.path()} was {how}: this process lost its lock and stops "
            "now, writing nothing more",
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
        """Give the lock back (nothing when this process does not hold it): renewal stops first (a renewal in
        flight ends before the file is deleted), and later changes through the storage are refused."""
        if self._thread is None:
            return
        self._stop.set()
        with self._renewing:  # no renewal in flight now, and none after
            version, self._version = self._version, None
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if version is not None:
            self.file.delete(version)  # only as this process last wrote it


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
    if process_state(pid) == "Z":  # killed, not yet reaped by its parent: it holds nothing any more
        return f"process {pid} has ended (a zombie, not yet reaped)"
    return None


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (field 3 of /proc/<pid>/stat: R, S, D, Z, ...; None: unknown)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split() if stat else []
    return fields[0] if fields else None


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
