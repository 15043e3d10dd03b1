"""``LeaseFile``: the run lock's file, changed only by compare-and-swap, for each kind of run storage.

Every change names the version it replaces (``replace``) or that there is none (``create``), and of two
processes changing one version exactly one succeeds: on a local filesystem each change holds an exclusive
``flock`` on the file while it reads, compares and writes in place (the kernel drops it when a process
dies, so a crash leaves nothing to clean up); on S3 a conditional put (``If-None-Match: *``,
``If-Match: <ETag>``, through boto3: ``pyarrow.fs`` has no conditional write). Other ``pyarrow.fs``
filesystems (``gs://``, ``hdfs://``) compare and write in two steps: best effort, two processes changing
the lock in the same instant can both succeed. ``age`` is how long ago the file was last written by the
storage's clock (a local file's mtime; on S3 the server's ``LastModified`` against its ``Date``), never
by the clock of the process that wrote it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from raysim.storage.base import RunLockedError, RunStorage
from raysim.storage.local import fsync_dir
from raysim.storage.remote import FsStorage

S3_EXTRA = 'pip install "raysim[s3]"'


@dataclass
class Observed:
    """The lock file as read: its bytes, the version a conditional change compares, its age in seconds."""

    data: bytes
    version: str | bytes
    age: float | None


class LeaseFile:
    """The lock file of a run directory; ``create``, ``replace`` return the new version, or None when the file
    was not what the change expected (another process changed it first)."""

    def read(self) -> Observed | None:
        raise NotImplementedError

    @contextmanager
    def holding(self) -> Iterator[Observed | None]:
        """The file as read (None: there is none), kept from changing until the body ends where the storage can
        (a local file: a shared ``flock``); elsewhere as read just before the body."""
        yield self.read()

    def create(self, data: bytes) -> str | bytes | None:
        raise NotImplementedError

    def replace(self, data: bytes, version: str | bytes) -> str | bytes | None:
        raise NotImplementedError

    def delete(self, version: str | bytes) -> None:
        """Remove the file if it is still at ``version``."""
        raise NotImplementedError


def lease_file(storage: RunStorage, rel: str) -> LeaseFile:
    """The lock file ``rel`` of ``storage``, changed atomically where the storage can."""
    if storage.is_local:
        return LocalLeaseFile(Path(storage.path(rel)))
    if storage.location.startswith("s3://"):
        return S3LeaseFile(storage.location, rel)
    return FsLeaseFile(storage, rel)


class LocalLeaseFile(LeaseFile):
    """A local lock file: read under a shared ``flock``, changed in place under an exclusive one. The version is
    the content itself; an empty file (a process died creating it) counts as none."""

    def __init__(self, path: Path):
        self.path = path

    @contextmanager
    def _flocked(self, operation: int, flags: int) -> Iterator[int | None]:
        """The file's descriptor with ``flock(operation)`` held, or None when there is no file; a file that was
        removed or replaced while this process waited for the flock is opened again."""
        while True:
            try:
                fd = os.open(self.path, flags, 0o644)
            except FileNotFoundError:
                yield None
                return
            fcntl.flock(fd, operation)
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)  # releases the flock

    @staticmethod
    def _content(fd: int) -> bytes:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _overwrite(fd: int, data: bytes) -> bytes:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        return data

    def read(self) -> Observed | None:
        with self._flocked(fcntl.LOCK_SH, os.O_RDONLY) as fd:
            if fd is None:
                return None
            data = self._content(fd)
            return Observed(data, data, time.time() - os.fstat(fd).st_mtime) if data else None

    @contextmanager
    def holding(self) -> Iterator[Observed | None]:
        with self._flocked(fcntl.LOCK_SH, os.O_RDONLY) as fd:
            data = self._content(fd) if fd is not None else b""
            yield Observed(data, data, None) if data else None

    def create(self, data: bytes) -> bytes | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._flocked(fcntl.LOCK_EX, os.O_RDWR | os.O_CREAT) as fd:
            if self._content(fd):
                return None
            self._overwrite(fd, data)
        fsync_dir(self.path.parent)
        return data

    def replace(self, data: bytes, version: str | bytes) -> bytes | None:
        with self._flocked(fcntl.LOCK_EX, os.O_RDWR) as fd:
            if fd is None or self._content(fd) != version:
                return None
            return self._overwrite(fd, data)

    def delete(self, version: str | bytes) -> None:
        with self._flocked(fcntl.LOCK_EX, os.O_RDWR) as fd:
            if fd is not None and self._content(fd) == version:
                os.unlink(self.path)  # a process waiting for the flock then finds the file gone


class S3LeaseFile(LeaseFile):
    """A lock object on S3, changed by conditional puts (boto3); the version is its ETag. Endpoint, region and
    credentials come from the usual AWS settings, or the URI's ``endpoint_override``, ``scheme``, ``region``."""

    def __init__(self, uri: str, rel: str):
        try:
            import boto3
        except ImportError:
            raise RunLockedError(
                f"locking a run directory on S3 ({uri}) needs boto3, which is not installed: {S3_EXTRA}"
            ) from None
        parts = urlsplit(uri)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        endpoint = query.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name=query.get("region"))
        self.bucket, self.key = parts.netloc, "/".join(p for p in (parts.path.strip("/"), rel) if p)

    def _refused(self, error: Exception, *codes: str) -> bool:
        """Whether ``error`` is S3's answer that the condition did not hold (or there was no such object)."""
        response = getattr(error, "response", None) or {}
        status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return response.get("Error", {}).get("Code") in codes or status in codes

    def read(self) -> Observed | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.ClientError as error:
            if self._refused(error, "NoSuchKey"):
                return None
            raise
        served = response["ResponseMetadata"]["HTTPHeaders"].get("date")
        age = (parsedate_to_datetime(served) - response["LastModified"]).total_seconds() if served else None
        return Observed(response["Body"].read(), response["ETag"], age)

    def _put(self, data: bytes, **condition: str) -> str | None:
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **condition)["ETag"]
        except self.client.exceptions.ClientError as error:
            if self._refused(error, "PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"):
                return None
            raise

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, version: str | bytes) -> str | None:
        return self._put(data, IfMatch=str(version))

    def delete(self, version: str | bytes) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=str(version))
        except self.client.exceptions.ClientError as error:
            if not self._refused(error, "PreconditionFailed", "NoSuchKey", "412"):
                raise


class FsLeaseFile(LeaseFile):
    """A lock file on another ``pyarrow.fs`` filesystem: compared, then written (best effort, not atomic)."""

    def __init__(self, storage: FsStorage, rel: str):
        self.storage, self.rel = FsStorage(storage.location), rel  # its own: the lock file is not fenced by itself

    def read(self) -> Observed | None:
        try:
            data = self.storage.read(self.rel)
        except FileNotFoundError:
            return None
        modified = self.storage.modified(self.rel)
        return Observed(data, data, None if modified is None else time.time() - modified)

    def create(self, data: bytes) -> bytes | None:
        return data if self.storage.create_exclusive(self.rel, data) else None

    def replace(self, data: bytes, version: str | bytes) -> bytes | None:
        current = self.read()
        if current is None or current.version != version:
            return None
        self.storage.write(self.rel, data)
        return data

    def delete(self, version: str | bytes) -> None:
        current = self.read()
        if current is not None and current.version == version:
            self.storage.remove(self.rel)
