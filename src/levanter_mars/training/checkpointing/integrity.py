"""Checkpoint integrity: a manifest written last, verification on resume, and quarantine of bad checkpoints.

How a checkpoint is known to be complete
----------------------------------------
Levanter writes every array with tensorstore, waits for all hosts, then writes ``metadata.json``. We then write
``levanter_mars_manifest.json``: every file of the checkpoint with its size and CRC32C. So:

* a directory without ``metadata.json`` was interrupted while its arrays were written (``kill -9``, preemption,
  disk full) and is *incomplete*;
* a directory whose manifest does not match its files (a missing, truncated or altered file) is *corrupt*. This
  matters because zarr reads a missing chunk file as zeros, silently, so tensorstore alone cannot tell;
* a directory with ``metadata.json`` but no manifest was interrupted between the two writes (its arrays are all
  there) or was written by plain Levanter: it is *unverified*, and is used only if it loads.

On local disk, files are written before ``metadata.json`` and the manifest is written to a temporary name and
renamed. On GCS every object write is atomic and the manifest is the last object written, after tensorstore has
committed every array, so the same reasoning holds; CRC32C values come from the object metadata, without reading.

Bad checkpoints are set aside under ``<checkpoint dir>.quarantine/`` (never deleted), so that neither Levanter's
discovery nor our audit uses them again. On local disk the whole directory is renamed there. Object storage has no
rename (a "move" copies and deletes every object: minutes for thousands of objects, while every host waits), so there
the quarantine costs a constant number of object operations, whatever the checkpoint's size:

* ``metadata.json`` and the manifest are moved into ``<checkpoint dir>.quarantine/step-N.<time>/``, with
  ``QUARANTINE_REASON.txt``: without ``metadata.json``, Levanter's discovery no longer sees the checkpoint;
* a marker, ``QUARANTINED.json``, is written into the checkpoint's own prefix: :func:`candidate_checkpoints` skips a
  marked prefix that has no ``metadata.json``;
* the arrays stay where they are until a later save of the same step rewrites them (docs/reliability.md says how to
  restore one by hand).

A marked prefix that has a ``metadata.json`` again was saved anew after the quarantine and is audited as usual (the
checkpointer removes the stale marker when it commits).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import logging
import os
import posixpath
import re
from typing import Any, Optional

import fsspec
import google_crc32c
from fsspec.implementations.local import LocalFileSystem

logger = logging.getLogger(__name__)

MANIFEST_NAME = "levanter_mars_manifest.json"
METADATA_NAME = "metadata.json"
QUARANTINE_MARKER = "QUARANTINED.json"
REASON_NAME = "QUARANTINE_REASON.txt"
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class CheckpointStatus:
    path: str
    step: Optional[int]
    state: str  # "verified" | "unverified" | "incomplete" | "corrupt"
    reason: str = ""
    run_info: Optional[dict] = None

    @property
    def usable(self) -> bool:
        return self.state in ("verified", "unverified")


def _fs_and_path(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, _, (plain,) = fsspec.get_fs_token_paths(str(path))
    return fs, plain


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def _with_protocol(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return path if _is_local(fs) else fs.unstrip_protocol(path)


def _crc32c_of_file(fs: fsspec.AbstractFileSystem, path: str) -> str:
    info = fs.info(path)
    remote = info.get("crc32c")
    if isinstance(remote, str) and remote:
        return base64.b64decode(remote).hex()  # GCS stores big-endian CRC32C, base64-encoded
    checksum = google_crc32c.Checksum()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return checksum.digest().hex()


def _list_files(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, int]:
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
    fs, root = _fs_and_path(checkpoint_path)
    files = {
        rel: {"size": size, "crc32c": _crc32c_of_file(fs, posixpath.join(root, rel))}
        for rel, size in sorted(_list_files(fs, root).items())
    }
    manifest = {
        "format": 1,
        "step": int(step),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "run_info": run_info or {},
        "files": files,
    }
    payload = json.dumps(manifest, indent=1, sort_keys=True)
    target = posixpath.join(root, MANIFEST_NAME)
    if _is_local(fs):
        tmp = target + ".tmp"
        with open(tmp, "w") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    else:
        with fs.open(target, "w") as f:
            f.write(payload)
    return manifest


def _check_manifest_layout(manifest: Any) -> None:
    """Valid JSON is not enough: a manifest must be what :func:`write_manifest` writes (raises ``ValueError``)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError("'files' is not a non-empty mapping")
    for rel, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("crc32c"), str)):
            raise ValueError(f"entry for {rel!r} is not {{size: int, crc32c: str}}")
    if not isinstance(manifest.get("run_info") or {}, dict):
        raise ValueError("'run_info' is not a mapping")


def audit_checkpoint(checkpoint_path: str, *, verify_checksums: bool = True) -> CheckpointStatus:
    """Classifies one ``step-N`` directory (see the module docstring)."""
    fs, root = _fs_and_path(checkpoint_path)
    try:
        with fs.open(posixpath.join(root, METADATA_NAME)) as f:
            metadata = json.load(f)
        step = int(metadata["step"])
    except FileNotFoundError:
        return CheckpointStatus(checkpoint_path, None, "incomplete", "no metadata.json: interrupted while writing")
    except (ValueError, KeyError, TypeError) as e:
        return CheckpointStatus(checkpoint_path, None, "corrupt", f"unreadable metadata.json ({e})")

    manifest_path = posixpath.join(root, MANIFEST_NAME)
    if not fs.exists(manifest_path):
        return CheckpointStatus(checkpoint_path, step, "unverified", "no manifest")
    try:
        with fs.open(manifest_path) as f:
            manifest = json.load(f)
        expected = manifest["files"]
        _check_manifest_layout(manifest)
    except (ValueError, KeyError, TypeError) as e:
        return CheckpointStatus(checkpoint_path, step, "corrupt", f"unreadable manifest ({e})")

    present = _list_files(fs, root)
    for rel, entry in expected.items():
        if rel not in present:
            return CheckpointStatus(checkpoint_path, step, "corrupt", f"missing file {rel}")
        if present[rel] != entry["size"]:
            return CheckpointStatus(
                checkpoint_path, step, "corrupt", f"{rel} has {present[rel]} bytes, expected {entry['size']}"
            )
        if verify_checksums and _crc32c_of_file(fs, posixpath.join(root, rel)) != entry["crc32c"]:
            return CheckpointStatus(checkpoint_path, step, "corrupt", f"checksum mismatch in {rel}")
    return CheckpointStatus(checkpoint_path, step, "verified", run_info=manifest.get("run_info") or {})


_STEP_DIR = re.compile(r"step-\d+")


def candidate_checkpoints(run_checkpoint_dir: str) -> list[str]:
    """The ``step-*`` style subdirectories of a run's checkpoint directory (and the directory itself)."""
    fs, root = _fs_and_path(run_checkpoint_dir)
    if not fs.exists(root):
        return []
    dirs = [_with_protocol(fs, p) for p in sorted(fs.ls(root, detail=False)) if fs.isdir(p) and _is_candidate(fs, p)]
    if fs.exists(posixpath.join(root, METADATA_NAME)):
        dirs.append(run_checkpoint_dir)
    return dirs


def _is_candidate(fs: fsspec.AbstractFileSystem, directory: str) -> bool:
    names = {posixpath.basename(p.rstrip("/")) for p in fs.ls(directory, detail=False)}  # one listing, no recursion
    if METADATA_NAME in names:
        return True
    # Quarantined in place on object storage (see the module docstring): already set aside.
    if QUARANTINE_MARKER in names:
        return False
    # A directory not named like a checkpoint (notes, a backup) is one only if it has metadata.json: without it, it is
    # not a torn checkpoint and must not be quarantined as one.
    return bool(_STEP_DIR.fullmatch(posixpath.basename(directory.rstrip("/"))))


def audit_run(run_checkpoint_dir: str, *, verify_checksums: bool = True) -> list[CheckpointStatus]:
    """Every checkpoint of a run, usable ones newest (highest step) first, then the unusable ones."""
    statuses = [audit_checkpoint(p, verify_checksums=verify_checksums) for p in candidate_checkpoints(run_checkpoint_dir)]
    usable = sorted((s for s in statuses if s.usable), key=lambda s: s.step or -1, reverse=True)
    return usable + [s for s in statuses if not s.usable]


def quarantine(checkpoint_path: str, reason: str) -> str:
    """Sets a bad checkpoint aside under ``<run dir>.quarantine/``, keeping it for inspection. Returns where its
    record went. Local disk: the directory is renamed there. Object storage: a constant number of object operations
    (see the module docstring)."""
    fs, root = _fs_and_path(checkpoint_path)
    parent, name = posixpath.split(root.rstrip("/"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    destination_dir = parent + ".quarantine"
    fs.makedirs(destination_dir, exist_ok=True)
    destination = posixpath.join(destination_dir, f"{name}.{stamp}")
    if _is_local(fs):
        fs.mv(root, destination, recursive=True)
        _write_text(fs, posixpath.join(destination, REASON_NAME), reason + "\n")
    else:
        _quarantine_in_place(fs, root, destination, reason)
    logger.warning("Quarantined checkpoint %s -> %s: %s", checkpoint_path, _with_protocol(fs, destination), reason)
    return _with_protocol(fs, destination)


def _quarantine_in_place(fs: fsspec.AbstractFileSystem, root: str, destination: str, reason: str) -> None:
    """Copies first, deletes last: interrupted anywhere, the checkpoint is either still whole (and quarantined again
    on the next audit) or set aside, never lost."""
    small = [n for n in (METADATA_NAME, MANIFEST_NAME) if fs.exists(posixpath.join(root, n))]
    for n in small:
        fs.copy(posixpath.join(root, n), posixpath.join(destination, n))
    arrays = fs.unstrip_protocol(root)
    _write_text(fs, posixpath.join(destination, REASON_NAME), (
        f"{reason}\n\nQuarantined in place (object storage): the arrays stay under {arrays}/ until a later save of "
        f"the same step rewrites them; {', '.join(small) or 'nothing else'} moved here. To restore: copy them back "
        f"into {arrays}/ and delete {arrays}/{QUARANTINE_MARKER} (docs/reliability.md).\n"
    ))
    _write_text(fs, posixpath.join(root, QUARANTINE_MARKER), json.dumps(
        {"reason": reason, "moved_to": fs.unstrip_protocol(destination), "moved": small}, indent=1
    ))
    for n in small:  # metadata.json first: from then on Levanter's discovery no longer sees the checkpoint
        fs.rm(posixpath.join(root, n))


def clear_quarantine_marker(checkpoint_path: str) -> None:
    """Removes the marker a quarantine in place left, once a new checkpoint of the same step is committed there."""
    fs, root = _fs_and_path(checkpoint_path)
    marker = posixpath.join(root, QUARANTINE_MARKER)
    if not _is_local(fs) and fs.exists(marker):
        fs.rm(marker)


def _write_text(fs: fsspec.AbstractFileSystem, path: str, text: str) -> None:
    with fs.open(path, "w") as f:
        f.write(text)


def check_writable(directory: str) -> None:
    """Fails fast, naming the path, if checkpoints could not be written there."""
    fs, root = _fs_and_path(directory)
    probe = posixpath.join(root, f".write_probe_{os.getpid()}")
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(probe, "w") as f:
            f.write("ok")
        fs.rm(probe)
    except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
        raise CheckpointError(
            f"trainer.checkpointer.base_path: cannot write checkpoints to {directory!r} ({type(e).__name__}: {e})"
        ) from e


#: Fields of ``run_info["optimizer"]`` that change the optimizer state's layout: a checkpoint written with other values
#: cannot be resumed. (Hyperparameters such as the learning rate may change between runs.)
LAYOUT_FIELDS = ("type", "exact", "optimize_1d", "efficient")


def check_compatible(status: CheckpointStatus, current_run_info: dict) -> None:
    """Raises :class:`CheckpointError` if the checkpoint's optimizer state cannot be loaded by this run."""
    saved = (status.run_info or {}).get("optimizer") or {}
    current = current_run_info.get("optimizer") or {}
    for key in LAYOUT_FIELDS:
        if key in saved and key in current and saved[key] != current[key]:
            raise CheckpointError(
                f"checkpoint {status.path} was written with optimizer.{key}={saved[key]!r}, but this run has "
                f"optimizer.{key}={current[key]!r}; its optimizer state cannot be resumed. Resume with the "
                f"original optimizer, or start a new run (a different trainer.id, or fresh=true to set the old "
                f"run aside)."
            )
