"""``RunStorage``: the interface of run storage, and ``Staging``: writing a directory that must appear whole.

A directory whose files must appear together (a checkpoint) is written through ``staging``: its files,
then a completion marker written by the caller, then ``commit``. On a local filesystem the staged
directory is renamed into place; on a filesystem without rename (object stores) the files are written
in place and the marker, written last, is what makes them complete.

Every change to the run (a write, a removal, a rename, a staged directory's commit) is fenced by the run's
lock once this process took it through the storage (``fence``): it is refused (``LeaseLostError``, nothing
changed) when another process took the run over or this one gave it back. A writer that needs a local path
writes through ``writing_dir``: on a local filesystem into the run itself, the fence held until it is done; elsewhere
into a local folder whose files are then written to the run, each fenced. The metrics sinks' writes: ``raysim.metrics``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+://")


def is_uri(location: str) -> bool:
    """Whether ``location`` names a filesystem by scheme (``s3://...``) rather than a local path."""
    return bool(_URI.match(location)) and not location.startswith("file://")


class StorageError(RuntimeError):
    """A run file that cannot be read or written: the message names it and says why."""


class RunLockedError(StorageError):
    """The run directory cannot be locked by this process: another process holds it (the message names it), or
    locking it needs a package that is not installed (the message says which extra)."""


class LeaseLostError(StorageError):
    """A change to a run directory refused because this process does not hold its lock (any more)."""


class Fence(Protocol):
    """What fences a run's changes: its lock (``RunLock``), held by this process or not."""

    def held(self) -> AbstractContextManager[None]:
        """A context in which this process holds the run (``LeaseLostError`` when it does not)."""
        ...


class Staging:
    """The files of one directory, written so that the directory appears whole (``commit``) or not at all."""

    PREFIX = ".tmp-"

    def write(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        raise NotImplementedError


class RunStorage:
    """A run directory: read and write its files by relative path."""

    location: str  # the local path or URI of the run directory
    is_local: bool
    can_rename = False  # object stores cannot: what a rename would retire is deleted, its marker first
    fence: Fence | None = None  # the run lock this process took through this storage (``RunLock.acquire``)

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """The body changes the run only while this process holds its lock (``RunLock.held``; no lock taken
        through this storage: no check)."""
        if self.fence is None:
            yield
            return
        with self.fence.held():
            yield

    def path(self, rel: str = "") -> str:
        """Where ``rel`` is (a local path or a URI), for messages."""
        return f"{self.location.rstrip('/')}/{rel}" if rel else self.location

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` whole (a reader sees the old content or the new, never a part)."""
        raise NotImplementedError

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` unless it exists; False when it does."""
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def list(self, rel: str) -> list[str]:
        """The names in directory ``rel`` (none when it does not exist)."""
        raise NotImplementedError

    def remove(self, rel: str) -> None:
        """Delete the file or directory tree ``rel`` (nothing when absent)."""
        raise NotImplementedError

    def rename(self, rel: str, to: str) -> None:
        """Move the file or directory ``rel`` to ``to`` (which must not exist) atomically; where ``can_rename``."""
        raise NotImplementedError

    def staging(self, rel: str) -> Staging:
        """Write directory ``rel`` (which must not exist) so that it appears whole."""
        raise NotImplementedError

    def local_copy(self, *rels: str) -> Path:
        """A local directory that holds the subtrees ``rels`` of the run (for readers that need real files:
        configs and the task's resources); the run directory itself when it is local."""
        raise NotImplementedError

    @contextmanager
    def writing_dir(self, rel: str) -> Iterator[Path]:
        """A local directory to write ``rel``'s files into (for writers that need a path: a task's resource
        export hook, TensorBoard); what it holds at the end is in the run at ``rel``."""
        with tempfile.TemporaryDirectory(prefix="raysim-") as tmp:
            folder = Path(tmp) / Path(rel).name
            folder.mkdir()
            yield folder
            self.upload(folder, rel)

    def upload(self, folder: Path, rel: str) -> None:
        """Every file below the local ``folder`` written to ``rel/...`` of the run."""
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.write(f"{rel}/{file.relative_to(folder).as_posix()}", file.read_bytes())

    def download(self, rel: str, folder: Path) -> None:
        """The subtree ``rel`` of the run into the local ``folder`` (missing: nothing)."""
        for name in self.list(rel):
            child = f"{rel}/{name}"
            if self.list(child) or self.is_dir(child):
                self.download(child, folder / name)
            else:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(self.read(child))

    def is_dir(self, rel: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Drop local copies (``local_copy``) of a remote run."""
        copies = getattr(self, "_copies", None)
        if copies:
            shutil.rmtree(copies, ignore_errors=True)
            self._copies = None
