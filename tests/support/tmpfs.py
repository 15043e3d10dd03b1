"""A tmpfs mounted for one test (mounting needs root): a small or read-only filesystem to run against."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(parent: Path, options: str, what: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options`` in a new folder of ``parent``, unmounted at the end; the test is skipped,
    saying why, where mounting ``what`` is not permitted."""
    mount = parent / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
