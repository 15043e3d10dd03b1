"""``RunClaim``: a training process's hold on its run directory, from before it writes there until it ends.

claim = RunClaim(storage, run_dir, break_lock)
claim.take()      # a resumed run: locked before Ray starts (a second process is refused at once)
claim.create()    # a new run: its directory chosen, made and locked in one step once its roles are sure to fit
claim.discard()   # a new run that failed before its first iteration: what it wrote is removed
claim.release()   # the lock, if this process holds it
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from raysim.composition import ConfigError
from raysim.coordinator.snapshot import new_run_refusal
from raysim.storage import RunLock, RunLockedError, RunStorage, open_storage

NEW_RUN = "choose another --run-dir"  # what a new run refused a locked run directory can do


class RunClaim:
    """The run directory's lock held by this process; ``break_lock`` takes it over from a live holder."""

    def __init__(self, storage: RunStorage, run_dir: str, break_lock: bool):
        self.run_dir, self.break_lock = run_dir, break_lock
        self.storage = storage
        self.lock = RunLock(storage)
        self.created = False  # a new run this process locked
        self.made = False  # and its local directory was made by this process

    def take(self) -> None:
        """Lock the run directory (``RunLockedError`` while another live process holds it)."""
        note = self.lock.acquire(force=self.break_lock)
        if note:
            print(f"raysim: {self.run_dir}: {note}", flush=True)

    def create(self, later: Iterable[str] = ()) -> str | None:
        """A new run: its directory made (a local one), locked, and found empty under the lock. A directory that
        another process holds, or that holds files by now, is passed over for the next of ``later`` (the default
        names after it), and the note says where the run goes; with none left (a ``run_dir`` given), refused."""
        first, later = self.run_dir, iter(later)
        while True:
            refusal = self._create()
            if refusal is None:
                self.created = True
                return f"{first} is taken: this run writes {self.run_dir}" if self.run_dir != first else None
            following = next(later, None)
            if following is None:
                raise refusal
            self.run_dir, self.storage = following, open_storage(following)
            self.lock = RunLock(self.storage)

    def _create(self) -> Exception | None:
        """Make, lock and look into ``run_dir``: why it cannot hold this new run (nothing left behind), or None."""
        local = Path(self.run_dir)
        if self.storage.is_local:
            if local.exists() and not local.is_dir():
                return ConfigError(f"run_dir {self.run_dir} is a file: {NEW_RUN}")
            self.made = not local.exists()
            local.mkdir(parents=True, exist_ok=True)
        try:
            self.lock.acquire(advice=NEW_RUN)
        except RunLockedError as error:
            return error
        refusal = new_run_refusal(self.storage, self.run_dir, ignore=(RunLock.FILE,))
        if refusal is None:
            return None
        self.lock.release()  # a run finished there since it was chosen: left as it is
        return ConfigError(refusal)

    def discard(self) -> None:
        """Remove what this new run created in its run directory (which held nothing before it: ``create``), the
        lock last, and the directory if it made it; nothing for a resumed run, or if another process took the
        lock over."""
        if not self.created or not self.lock.clear_run():
            return
        self.lock.release()
        if self.made:
            Path(self.run_dir).rmdir()
        what = self.run_dir if self.made else f"what the run wrote in {self.run_dir}"
        print(f"raysim: removed {what}: the run failed before its first iteration completed", flush=True)

    def release(self) -> None:
        """Give the lock back (only if this process holds it)."""
        self.lock.release()
