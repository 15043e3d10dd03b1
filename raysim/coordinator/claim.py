"""``RunClaim``: a training process's hold on its run directory, from before it writes there until it ends.

claim = RunClaim(storage, run_dir, break_lock)
claim.take()      # a resumed run: locked before Ray starts (a second process is refused at once)
claim.create()    # a new run: its directory made and locked once its roles are sure to fit
claim.discard()   # a new run that failed before its first iteration: what it wrote is removed
claim.release()   # the lock, if this process holds it
"""

from __future__ import annotations

from pathlib import Path

from raysim.storage import RunLock, RunStorage


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

    def create(self) -> None:
        """A new run: its directory made (a local one) and locked."""
        if self.storage.is_local:
            self.made = not Path(self.run_dir).exists()
            Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        self.take()
        self.created = True

    def discard(self) -> None:
        """Remove what this new run created in its run directory (which held nothing before it: ``choose_run_dir``),
        the lock last, and the directory if it made it; nothing for a resumed run, or if another process took
        the lock over."""
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
