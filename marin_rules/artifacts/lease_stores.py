"""Conditional writes of one small file, for leases: local folders and gs://.

Model: a `LeaseStore` holds one file and offers compare-and-set on it. `read()` gives
(bytes or None, version), `age_s()` the seconds since the file was last written (the
file's mtime, the object's `updated`); `create` succeeds only if the file is absent; `replace` and
`delete` only if the file is still at the version the caller saw. They return the new
version, or None (False for delete) when someone else moved first. The version is the
file's bytes locally and the object generation on gs://. See lease.py for why each
operation is race-free. A local lease file or lock that cannot be opened (a folder in
its place, a file in place of a folder above it, no permission: `UNUSABLE`) raises
`LeaseFileUnusable`: one line naming the file and the fix, before any lease is written
(creation, too, holds the lock); so does a lease file that cannot be staged in its
folder (a read-only folder). Other errors of the storage (an NFS EIO or ESTALE) pass on
as they are: the job names them as the prefix's storage errors.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, Iterator, Protocol

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError


class LeaseStore(Protocol):
    def read(self) -> tuple[bytes | None, Any]: ...
    def age_s(self) -> float | None: ...  # since the file was last written; None: absent
    def create(self, data: bytes) -> Any | None: ...
    def replace(self, data: bytes, expected: Any) -> Any | None: ...
    def delete(self, expected: Any) -> bool: ...


class LeaseFileUnusable(MarinError):
    """A local lease file or its lock that this process cannot open (`unusable`)."""


# what stops a lease file or lock from being opened that its user can fix (`unusable`); any
# other OSError is the storage's (EIO, ESTALE) and passes on as it is
UNUSABLE = (IsADirectoryError, NotADirectoryError, PermissionError)


def unusable(path: str, error: OSError) -> LeaseFileUnusable:
    """One line naming the lease file (or lock, or the temporary file a new lease is
    staged in) at `path` that could not be opened, and the fix."""
    what = "lock file" if path.endswith(".lock") else "temporary file" if ".tmp-" in path else "file"
    if isinstance(error, IsADirectoryError):
        fix = f"a folder is in its place: remove it (the lease's {what} is a plain file, made again when absent)"
    elif isinstance(error, NotADirectoryError):
        fix = "a file is in place of a folder above it: move it away"
    elif isinstance(error, PermissionError):
        fix = "give this user read and write access to it and to its folder"
    else:  # staging a new lease (`LocalStore.create`): its folder takes no new file
        fix = "its folder must take a new file (writable, with free space, the path within the system's limit)"
    return LeaseFileUnusable(f"{path}: the lease's {what} cannot be opened ({type(error).__name__}: "
                             f"{error.strerror or error}); {fix}")  # fmt: skip


class LocalStore:
    """A file in a local folder: create by os.link (atomic, fails if present); replace and
    delete under an exclusive flock of `<file>.lock`, checking the bytes first."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> tuple[bytes | None, Any]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None, None
        except UNUSABLE as e:
            raise unusable(self.path, e) from None
        return data, data

    def age_s(self) -> float | None:
        try:
            return max(0.0, time.time() - os.stat(self.path).st_mtime)
        except FileNotFoundError:
            return None

    def _staged(self, data: bytes) -> str:
        """A new temporary file beside the lease file holding `data`; none is left when writing it fails."""
        tmp = storage.temporary_sibling(self.path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def create(self, data: bytes) -> Any | None:
        with self._locked():  # (not needed for the link: a lock that cannot be opened stops us before it)
            try:
                tmp = self._staged(data)
            except OSError as e:  # a read-only folder: no lease can be created here
                raise unusable(f"{self.path}.tmp-*", e) from None
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return None
            finally:
                os.unlink(tmp)
            return data

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.path + ".lock"
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except UNUSABLE as e:
            raise unusable(lock, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def replace(self, data: bytes, expected: Any) -> Any | None:
        with self._locked():
            if self.read()[0] != expected or expected is None:
                return None
            os.replace(self._staged(data), self.path)
            return data

    def delete(self, expected: Any) -> bool:
        with self._locked():
            if self.read()[0] != expected or expected is None:
                return False
            os.unlink(self.path)
            return True


class GcsStore:
    """An object in a GCS bucket, every write conditional on the generation last seen."""

    def __init__(self, url: str):
        bucket, _, self.name = url[len("gs://") :].partition("/")
        self.bucket = _client().bucket(bucket)

    def read(self) -> tuple[bytes | None, Any]:
        from google.api_core import exceptions

        for _ in range(5):  # the object may change between metadata and content
            blob = self.bucket.get_blob(self.name, timeout=30)
            if blob is None:
                return None, None
            generation = blob.generation  # (a download may reset the blob's properties)
            try:
                return blob.download_as_bytes(if_generation_match=generation, timeout=30), generation
            except (exceptions.NotFound, exceptions.PreconditionFailed):
                continue
        raise MarinError(f"gs://{self.bucket.name}/{self.name}: kept changing while being read; try again")

    def age_s(self) -> float | None:
        import datetime as dt

        blob = self.bucket.get_blob(self.name, timeout=30)
        if blob is None or blob.updated is None:
            return None
        return max(0.0, (dt.datetime.now(dt.timezone.utc) - blob.updated).total_seconds())

    def _upload(self, data: bytes, generation: int) -> Any | None:
        from google.api_core import exceptions

        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(data, content_type="application/json", if_generation_match=generation, timeout=30)
        except exceptions.PreconditionFailed:
            return None
        return blob.generation

    def create(self, data: bytes) -> Any | None:
        return self._upload(data, 0)

    def replace(self, data: bytes, expected: Any) -> Any | None:
        return None if expected is None else self._upload(data, expected)

    def delete(self, expected: Any) -> bool:
        from google.api_core import exceptions

        if expected is None:
            return False
        try:
            self.bucket.blob(self.name).delete(if_generation_match=expected, timeout=30)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return False
        return True


@lru_cache(maxsize=None)
def _client():
    """One google-cloud-storage client per process (application default credentials,
    or anonymous against STORAGE_EMULATOR_HOST)."""
    from google.cloud import storage as gcs

    return gcs.Client()


def store_for(location: str, file_name: str) -> LeaseStore:
    """The store for `{location}/{file_name}`: local folders and gs:// only."""
    target = storage.join(location, file_name)
    if target.startswith("gs://"):
        return GcsStore(target)
    if storage.is_remote(target):
        scheme = target.split("://", 1)[0]
        raise MarinError(f"{location}: leases need a local folder or a gs:// prefix; {scheme}:// has no conditional writes here")
    return LocalStore(storage.local_path(target))
