"""Writing a file whole, on local disk or object storage alike: a reader sees the old content or the new, never part.

Local disk: the bytes go to a temporary name in the same directory, are flushed to disk, and the name is swapped in
(``os.replace``, atomic within a file system). Object storage (gs://, s3://, memory://): one single-object put, which
the store makes visible whole or not at all (a stream, ``open_whole``: one upload, finalized when it ends or
cancelled).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import IO, Any, Iterator, Optional

import fsspec
from fsspec.implementations.local import LocalFileSystem


def write_whole(url: str | os.PathLike, data: bytes | str) -> None:
    """Writes ``data`` (text is UTF-8) to ``url``, creating its directory, so that no reader ever sees part of it."""
    payload = data.encode() if isinstance(data, str) else bytes(data)
    fs, path = fsspec.core.url_to_fs(str(url))
    if not isinstance(fs, LocalFileSystem):  # one put
        parent = path.rsplit("/", 1)[0]
        if parent and parent != path:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(path, payload)
        return
    with open_whole(url) as f:
        f.write(payload)


@contextlib.contextmanager
def open_whole(url: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary file to stream into ``url`` that readers see whole or not at all: committed when the block ends,
    discarded if it raises (locally a temporary name renamed at the end; on object storage one upload, finalized on
    close or cancelled)."""
    fs, path = fsspec.core.url_to_fs(str(url))
    if isinstance(fs, LocalFileSystem):
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    parent = path.rsplit("/", 1)[0]
    if parent and parent != path:
        fs.makedirs(parent, exist_ok=True)
    existed = fs.exists(path)
    f = fs.open(path, "wb")
    try:
        yield f
    except BaseException:
        _abandon(fs, path, f, existed)
        raise
    f.close()


def _abandon(fs, path: str, f, existed: bool) -> None:
    """Leaves no object of a stream that failed: its upload cancelled (gcsfs starts one only past its first block:
    below that, closing the file, or collecting it, would still put what it holds), and an object the store made
    at ``open`` (memory://) removed."""
    discard = getattr(f, "discard", None)
    if discard is not None:
        try:
            discard()
        except Exception:  # noqa: BLE001 - a cancel that fails leaves the upload unfinalized: no object either
            pass
    buffer = getattr(f, "buffer", None)
    if buffer is not None:
        buffer.seek(0)
        buffer.truncate()
    try:
        f.closed = True  # fsspec's close() and __del__ do nothing more for a closed file
    except AttributeError:
        pass
    if not existed and fs.exists(path):
        fs.rm(path)


def read_whole(url: str | os.PathLike) -> Optional[bytes]:
    """The content of a file written by :func:`write_whole` (None if there is none)."""
    fs, path = fsspec.core.url_to_fs(str(url))
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_json(url: str | os.PathLike) -> Any:
    """A JSON file written whole (None if there is none; a file that is not JSON raises ``ValueError`` naming it)."""
    data = read_whole(url)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{url}: not a JSON file ({e})") from e
