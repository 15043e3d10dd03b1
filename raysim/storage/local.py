"""``LocalStorage``: a run directory on a local filesystem; writes are atomic (rename) and durable (fsync)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raysim.storage.base import RunStorage, Staging


class LocalStorage(RunStorage):
    """A run directory on the local filesystem."""

    is_local = True
    can_rename = True

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.location = str(self.root)

    def path(self, rel: str = "") -> str:
        return str(self.root / rel) if rel else str(self.root)

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        """``rel`` replaced atomically and durably: a temporary file, fsync, rename, fsync of the directory."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        with self.fenced(), naming(target):
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
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with self.fenced(), naming(target):
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

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def list(self, rel: str) -> list[str]:
        folder = self.root / rel
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def remove(self, rel: str) -> None:
        target = self.root / rel
        with self.fenced():
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)

    def rename(self, rel: str, to: str) -> None:
        source, target = self.root / rel, self.root / to
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise FileExistsError(f"cannot move {source} to {target}: it exists")
        with self.fenced():
            os.rename(source, target)
        fsync_dir(target.parent)
        fsync_dir(source.parent)

    def staging(self, rel: str) -> Staging:
        with self.fenced():  # no staged files in a run this process does not hold (its commit checks again)
            return LocalStaging(self, self.root / rel)

    def local_copy(self, *rels: str) -> Path:
        return self.root

    @contextmanager
    def writing_dir(self, rel: str) -> Iterator[Path]:
        """``rel`` itself, fenced while the body writes there (a take-over waits for it to end)."""
        folder = self.root / rel
        with self.fenced():
            folder.mkdir(parents=True, exist_ok=True)
            yield folder


class LocalStaging(Staging):
    """A directory written under a temporary name, fsynced, and renamed into place on ``commit`` (fenced)."""

    def __init__(self, storage: LocalStorage, final: Path):
        self.storage, self.final = storage, final
        self.tmp = final.with_name(f"{self.PREFIX}{final.name}-{os.getpid()}")
        with naming(final):
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir()

    def write(self, name: str, data: bytes) -> None:
        with naming(self.final / name), open(self.tmp / name, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def commit(self) -> None:
        fsync_dir(self.tmp)
        with self.storage.fenced():
            os.rename(self.tmp, self.final)
        fsync_dir(self.final.parent)

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An ``OSError`` of the body names ``path``, the file being written: a full disk's error names no file, and a
    temporary file's name is not one the user knows."""
    try:
        yield
    except OSError as error:
        if error.errno is None:
            raise
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error


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


def unwritable(folder: str | Path) -> str | None:
    """Why nothing can be written in the directory ``folder`` (created if missing): a file where a directory
    must be, a read-only filesystem, no permission; None when it can. Leaves nothing behind."""
    folder = Path(folder)
    existing = next(p for p in [folder, *folder.parents] if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".raysim-write-check-"):
            pass
    except OSError as error:
        return f"cannot write in {existing} ({error.strerror or error})"
    return None


def write_parquet(path: str | Path, table) -> Path:
    """A ``pyarrow.Table`` as a Parquet file at the local ``path``, atomically (a temporary file, then rename)."""
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
