"""Where the run's lease lives (``lease.py``), with the two operations that make it exclusive: a create that fails when
the record exists, and a replace (or delete) that fails when the record is no longer the version its writer read.

* **Local disk**: every operation holds an exclusive ``flock`` on a lock file beside the record (``<lease>.lock``,
  never deleted: deleting it would let two holders lock two files); a version is the SHA-256 of the record's bytes
  (every record differs: a new token or a new renewal time), written whole (a temporary name, then a rename).
* **gs://**: the object's generation, through the JSON API's preconditions (``ifGenerationMatch=0`` to create,
  ``ifGenerationMatch=<generation read>`` to replace or delete), with google-cloud-storage (gcsfs, which the run's
  other gs:// files go through, sends no precondition but the create's).

Time is the storage's: when a version was written is the time the storage stamps on it (a file's modification time,
an object's ``updated``), and "now" is the stamp the storage puts on a write made now (the lock file touched; a
small probe object beside the record). A reader and a holder on machines whose clocks disagree judge a lapse alike.

Any other failure of the storage raises :class:`~levanter_mars.training.errors.StorageError` naming the record
(exit 5), or ``StoragePathError`` where no retry can write there (a file in the way, no permission: exit 2).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol

from levanter_mars.training.checkpointing.storage import fs_and_path, is_local, never_writable
from levanter_mars.training.errors import StorageError, StoragePathError
from levanter_mars.training.whole_files import write_whole

LOCK_SUFFIX = ".lock"
#: Where the lease lives: beside the checkpoints.
FIELD = "trainer.checkpointer.base_path"
GCS_PROTOCOLS = ("gs", "gcs")


@dataclass(frozen=True)
class Version:
    """The record as the storage holds it now."""

    data: bytes
    generation: str
    written_at: float
    """When the storage says this version was written (seconds since the epoch, the storage's clock)."""


class LeaseStore(Protocol):
    path: str

    def read(self) -> Optional[Version]: ...

    def create(self, data: bytes) -> Optional[str]:
        """The new version's generation, or None if a record exists."""

    def replace(self, data: bytes, generation: str) -> Optional[str]:
        """The new version's generation, or None unless the record is still ``generation``."""

    def delete(self, generation: str) -> bool:
        """Whether the record, still ``generation``, was deleted."""

    def now(self) -> float:
        """The storage's clock now."""


def store_for(path: str) -> LeaseStore:
    fs, plain = fs_and_path(path)
    if is_local(fs):
        return LocalStore(plain)
    if set(GCS_PROTOCOLS) & set([fs.protocol] if isinstance(fs.protocol, str) else fs.protocol):
        return GcsStore(path)
    raise StoragePathError(
        f"{FIELD}: the run's lease {path} needs local disk or gs:// (an atomic create and a "
        f"conditional replace); {fs.protocol} has neither here"
    )


def _storage_error(path: str, error: BaseException) -> Exception:
    """A path no retry can write (a file in the way, no permission) is a config error; anything else the storage's."""
    kind = StoragePathError if never_writable(error) else StorageError
    return kind(f"{FIELD}: the run's lease {path}: {type(error).__name__}: {error}")


class LocalStore:
    def __init__(self, path: str):
        self.path = path
        self.lock_path = path + LOCK_SUFFIX

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _storage_error(self.path, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # per open file: threads of one process exclude each other too
            yield fd
        except OSError as e:
            raise _storage_error(self.path, e) from e
        finally:
            os.close(fd)  # releases the lock

    def _current(self) -> Optional[Version]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                written_at = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return Version(data, _digest(data), written_at)

    def _write(self, data: bytes) -> str:
        write_whole(self.path, data)
        return _digest(data)

    def read(self) -> Optional[Version]:
        with self._locked():
            return self._current()

    def create(self, data: bytes) -> Optional[str]:
        with self._locked():
            return None if self._current() is not None else self._write(data)

    def replace(self, data: bytes, generation: str) -> Optional[str]:
        with self._locked():
            current = self._current()
            return self._write(data) if current is not None and current.generation == generation else None

    def delete(self, generation: str) -> bool:
        with self._locked():
            current = self._current()
            if current is None or current.generation != generation:
                return False
            os.remove(self.path)
            return True

    def now(self) -> float:
        with self._locked() as fd:
            os.utime(fd)  # the file system's time (an NFS server's, on NFS), as it stamps the record
            return os.fstat(fd).st_mtime


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_clients = threading.local()


def _gcs_client():
    """One google-cloud-storage client per thread (a client is not shared between threads) and emulator setting."""
    from google.cloud import storage

    key = os.environ.get("STORAGE_EMULATOR_HOST")
    cached = getattr(_clients, "by_endpoint", None)
    if cached is None:
        cached = _clients.by_endpoint = {}
    if key not in cached:
        cached[key] = storage.Client(project=None)  # no project: objects of a named bucket need none
    return cached[key]


class GcsStore:
    def __init__(self, path: str):
        self.path = path
        bucket, _, self.key = path.split("://", 1)[1].partition("/")
        self.bucket = bucket
        if not self.key:
            raise StoragePathError(f"{FIELD}: the run's lease {path} names no object")

    def _blob(self, key: Optional[str] = None):
        return _gcs_client().bucket(self.bucket).blob(key or self.key)

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
        """What the operation did not expect (a failed precondition is expected where it is caught) is the storage's
        trouble: the service failing, the network, credentials, a missing bucket."""
        try:
            yield
        except Exception as e:  # noqa: BLE001
            raise _storage_error(self.path, e) from e

    def read(self) -> Optional[Version]:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with self._storage_errors():
            for _ in range(10):
                blob = _gcs_client().bucket(self.bucket).get_blob(self.key)
                if blob is None:
                    return None
                try:  # the bytes of the generation whose time was read, or read both again
                    data = blob.download_as_bytes(if_generation_match=blob.generation)
                except (PreconditionFailed, NotFound):
                    continue
                return Version(data, str(blob.generation), blob.updated.timestamp())
        raise StorageError(f"{FIELD}: the run's lease {self.path} changed at every read (10 reads)")

    def _upload(self, data: bytes, generation: int) -> Optional[str]:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob()
        with self._storage_errors():
            try:
                blob.upload_from_string(data, content_type="application/json", if_generation_match=generation)
            except PreconditionFailed:  # created meanwhile, or no longer that generation (a missing bucket: 404)
                return None
        return str(blob.generation)

    def create(self, data: bytes) -> Optional[str]:
        return self._upload(data, 0)

    def replace(self, data: bytes, generation: str) -> Optional[str]:
        return self._upload(data, int(generation))

    def delete(self, generation: str) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with self._storage_errors():
            try:
                self._blob().delete(if_generation_match=int(generation))
            except (PreconditionFailed, NotFound):
                return False
        return True

    def now(self) -> float:
        from google.api_core.exceptions import NotFound

        probe = self._blob(f"{self.key}.clock-{uuid.uuid4().hex}")
        with self._storage_errors():
            probe.upload_from_string(b"", if_generation_match=0)
            stamped = probe.updated.timestamp()
            with contextlib.suppress(NotFound):
                probe.delete()
        return stamped
