"""The manifest written last into a committed checkpoint: every file with its size and CRC32C.

Levanter writes every array with tensorstore, waits for all hosts, then writes ``metadata.json``; we then write
``levanter_mars_manifest.json``. On local disk it is written to a temporary name and renamed. On GCS every object
write is atomic and the manifest is the last object written, after tensorstore has committed every array; CRC32C
values come from the object metadata, without reading. :mod:`.audit` says what a checkpoint without one means.
"""

from __future__ import annotations

import base64
import datetime
import json
import posixpath
from typing import Any, Optional

import fsspec
import google_crc32c

from levanter_mars.training.checkpointing.storage import MANIFEST_NAME, QUARANTINE_MARKER, fs_and_path, with_protocol
from levanter_mars.training.whole_files import write_whole

_CHUNK = 8 << 20


def crc32c_of_file(fs: fsspec.AbstractFileSystem, path: str) -> str:
    info = fs.info(path)
    remote = info.get("crc32c")
    if isinstance(remote, str) and remote:
        return base64.b64decode(remote).hex()  # GCS stores big-endian CRC32C, base64-encoded
    checksum = google_crc32c.Checksum()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return checksum.digest().hex()


def list_files(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, int]:
    """A checkpoint's files and sizes, relative to ``root``: what a manifest covers (not itself, nor our markers)."""
    files = {}
    for path, info in fs.find(root, detail=True).items():
        if info.get("type", "file") != "file":
            continue
        rel = posixpath.relpath(path, root)
        if rel in (MANIFEST_NAME, QUARANTINE_MARKER) or rel.endswith(".tmp"):
            continue
        files[rel] = int(info["size"])
    return files


def write_manifest(checkpoint_path: str, *, step: int, run_info: Optional[dict] = None) -> dict:
    """Records every file of a committed checkpoint. Call after ``metadata.json`` is written."""
    fs, root = fs_and_path(checkpoint_path)
    files = {
        rel: {"size": size, "crc32c": crc32c_of_file(fs, posixpath.join(root, rel))}
        for rel, size in sorted(list_files(fs, root).items())
    }
    manifest = {
        "format": 1,
        "step": int(step),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "run_info": run_info or {},
        "files": files,
    }
    write_whole(with_protocol(fs, posixpath.join(root, MANIFEST_NAME)), json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def check_manifest_layout(manifest: Any) -> None:
    """Valid JSON is not enough: a manifest must be what :func:`write_manifest` writes (raises ``ValueError``)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError("'files' is not a non-empty mapping")
    for rel, entry in files.items():
        well_formed = isinstance(entry, dict) and isinstance(entry.get("size"), int)
        if not (well_formed and isinstance(entry.get("crc32c"), str)):
            raise ValueError(f"entry for {rel!r} is not {{size: int, crc32c: str}}")
    if not isinstance(manifest.get("run_info") or {}, dict):
        raise ValueError("'run_info' is not a mapping")
