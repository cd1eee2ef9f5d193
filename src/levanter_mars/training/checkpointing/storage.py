"""Where checkpoint files live: the names we write next to Levanter's, and local disk vs object storage."""

from __future__ import annotations

import errno
import os
import posixpath

import fsspec
from fsspec.implementations.local import LocalFileSystem

from levanter_mars.training.errors import CheckpointError, StoragePathError

MANIFEST_NAME = "levanter_mars_manifest.json"
METADATA_NAME = "metadata.json"
QUARANTINE_MARKER = "QUARANTINED.json"
REASON_NAME = "QUARANTINE_REASON.txt"


def fs_and_path(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, _, (plain,) = fsspec.get_fs_token_paths(str(path))
    return fs, plain


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def with_protocol(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)


def write_text(fs: fsspec.AbstractFileSystem, path: str, text: str) -> None:
    with fs.open(path, "w") as f:
        f.write(text)


def check_writable(
    directory: str, *, field: str = "trainer.checkpointer.base_path", what: str = "checkpoints"
) -> None:
    """Fails fast, naming the field and the path, if ``what`` could not be written there."""
    fs, root = fs_and_path(directory)
    probe = posixpath.join(root, f".write_probe_{os.getpid()}")
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(probe, "w") as f:
            f.write("ok")
        fs.rm(probe)
    except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
        kind = StoragePathError if never_writable(e) else CheckpointError
        raise kind(f"{field}: cannot write {what} to {directory!r} ({type(e).__name__}: {e})") from e


def never_writable(error: BaseException) -> bool:
    """Whether ``error`` says the path itself is wrong (no retry writes there), not that the storage failed."""
    path_errors = (NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError)
    return isinstance(error, path_errors) or (isinstance(error, OSError) and error.errno == errno.EROFS)
