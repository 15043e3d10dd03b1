"""One of several processes that take a run's lock at the same instant (``tests/test_run_lock.py``)."""

from __future__ import annotations

import os

from raysim.storage import RunLock, RunLockedError, open_storage


def race(location: str, env: dict, start, results, done) -> None:
    """Take the lock of ``location`` (with the variables ``env``) once every racer is ready; say "won" or
    "refused"; a winner holds it until ``done`` (every racer has tried)."""
    os.environ.update(env)
    lock = RunLock(open_storage(location))
    start.wait()
    try:
        lock.acquire()
        results.put("won")
        done.wait(60)
        lock.release()
    except RunLockedError:
        results.put("refused")
