"""``FsStorage``: a run directory on any ``pyarrow.fs`` filesystem (S3, GCS, HDFS, ...), given by its URI.

Object stores have no rename: a file is written whole by one put, and a directory that must appear
whole (a checkpoint) is written file by file in place, its completion marker last. Credentials and
endpoints come from the filesystem's usual settings (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from raysim.storage.base import RunStorage, Staging, StorageError


class FsStorage(RunStorage):
    """A run directory at ``uri`` on a ``pyarrow.fs`` filesystem."""

    is_local = False

    def __init__(self, uri: str):
        from pyarrow import fs

        self.location = uri.rstrip("/")
        try:
            self.fs, self.base = fs.FileSystem.from_uri(self.location)
            bucket = self.fs.get_file_info(self.base.split("/", 1)[0])
        except Exception as error:  # an unknown scheme, a bucket that cannot be reached, no credentials
            raise StorageError(f"cannot open run storage {uri}: {error}") from error
        if bucket.type == fs.FileType.NotFound:
            raise StorageError(
                f"cannot open run storage {uri}: its bucket {bucket.path!r} does not exist (create it, or check the "
                "endpoint and credentials: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_DEFAULT_REGION)"
            )
        self._copies: Path | None = None

    def _full(self, rel: str) -> str:
        return f"{self.base}/{rel}" if rel else self.base

    def _info(self, rel: str):
        return self.fs.get_file_info(self._full(rel))

    def read(self, rel: str) -> bytes:
        try:
            with self.fs.open_input_stream(self._full(rel)) as stream:
                return stream.read()
        except FileNotFoundError:
            raise
        except OSError as error:
            if "not found" in str(error).lower() or "does not exist" in str(error).lower():
                raise FileNotFoundError(f"{self.path(rel)} does not exist") from error
            raise

    def write(self, rel: str, data: bytes) -> None:
        parent = self._full(rel).rpartition("/")[0]
        with self.fenced():
            self.fs.create_dir(parent, recursive=True)
            with self.fs.open_output_stream(self._full(rel)) as stream:
                stream.write(data)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` unless it exists. Object stores have no atomic create: two processes starting within
        the same instant can both succeed (the run lock then says so at the next renewal)."""
        if self.exists(rel):
            return False
        self.write(rel, data)
        return True

    def exists(self, rel: str) -> bool:
        from pyarrow import fs

        return self._info(rel).type != fs.FileType.NotFound

    def is_dir(self, rel: str) -> bool:
        from pyarrow import fs

        return self._info(rel).type == fs.FileType.Directory

    def modified(self, rel: str) -> float | None:
        """When ``rel`` was last written, in seconds since the epoch by the filesystem's clock (None: unknown)."""
        mtime = self._info(rel).mtime
        return None if mtime is None else mtime.timestamp()

    def list(self, rel: str) -> list[str]:
        from pyarrow import fs

        if not self.is_dir(rel):
            return []
        infos = self.fs.get_file_info(fs.FileSelector(self._full(rel), recursive=False))
        return sorted(info.base_name for info in infos)

    def remove(self, rel: str) -> None:
        from pyarrow import fs

        kind = self._info(rel).type
        with self.fenced():
            if kind == fs.FileType.Directory:
                self.fs.delete_dir(self._full(rel))
            elif kind == fs.FileType.File:
                self.fs.delete_file(self._full(rel))

    def staging(self, rel: str) -> Staging:
        return InPlaceStaging(self, rel)

    def local_copy(self, *rels: str) -> Path:
        """The subtrees ``rels`` downloaded into a local directory kept until ``close``."""
        if self._copies is None:
            self._copies = Path(tempfile.mkdtemp(prefix="raysim-run-"))
        for rel in rels:
            self.download(rel, self._copies / rel)
        return self._copies


class InPlaceStaging(Staging):
    """Files written in place; the caller's completion marker, written last, makes the directory complete."""

    def __init__(self, storage: FsStorage, rel: str):
        self.storage, self.rel = storage, rel

    def write(self, name: str, data: bytes) -> None:
        self.storage.write(f"{self.rel}/{name}", data)

    def commit(self) -> None:
        """Nothing to do: the marker written last completed the directory."""

    def abandon(self) -> None:
        self.storage.remove(self.rel)
