"""Writing a file whole, on local disk or object storage alike: a reader sees the old content or the new, never part.

Local disk: the bytes go to a temporary name in the same directory, are flushed to disk, and the name is swapped in
(``os.replace``, atomic within a file system). Object storage (gs://, s3://, memory://): one single-object put, which
the store makes visible whole or not at all.
"""

from __future__ import annotations

import os
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem


def write_whole(url: str | os.PathLike, data: bytes | str) -> None:
    """Writes ``data`` (text is UTF-8) to ``url``, creating its directory, so that no reader ever sees part of it."""
    payload = data.encode() if isinstance(data, str) else bytes(data)
    fs, path = fsspec.core.url_to_fs(str(url))
    if isinstance(fs, LocalFileSystem):
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
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
    fs.pipe_file(path, payload)
