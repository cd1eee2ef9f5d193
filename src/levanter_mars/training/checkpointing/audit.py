"""Which checkpoints of a run are usable: each ``step-N`` directory classified from its metadata and manifest.

* a directory without ``metadata.json`` was interrupted while its arrays were written (``kill -9``, preemption,
  disk full), or while it was deleted (its metadata goes first: ``compat.levanter_training.RemovesItsMarkersFirst``),
  and is *incomplete*;
* a directory whose manifest does not match its files (a missing, truncated or altered file) is *corrupt*. This
  matters because zarr reads a missing chunk file as zeros, silently, so tensorstore alone cannot tell;
* a directory with ``metadata.json`` but no manifest was interrupted between the two writes (its arrays are all
  there) or was written by plain Levanter: it is *unverified*, and is used only if it loads;
* one whose manifest matches is *verified*.

A prefix quarantined in place on object storage (:mod:`.quarantine`) and not saved anew is no candidate at all.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from typing import Optional

import fsspec

from levanter_mars.training.checkpointing.manifest import check_manifest_layout, crc32c_of_file, list_files
from levanter_mars.training.checkpointing.storage import (
    MANIFEST_NAME,
    METADATA_NAME,
    QUARANTINE_MARKER,
    fs_and_path,
    with_protocol,
)

#: How Levanter names a step's checkpoint (and we an HF export's directory); group 1 is the step.
STEP_DIR = re.compile(r"step-(\d+)")


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


def audit_checkpoint(checkpoint_path: str, *, verify_checksums: bool = True) -> CheckpointStatus:
    """Classifies one ``step-N`` directory (see the module docstring)."""
    fs, root = fs_and_path(checkpoint_path)
    try:
        with fs.open(posixpath.join(root, METADATA_NAME)) as f:
            metadata = json.load(f)
        step = int(metadata["step"])
    except FileNotFoundError:
        return CheckpointStatus(checkpoint_path, None, "incomplete",
                                "no metadata.json: interrupted while writing or deleting")
    except (ValueError, KeyError, TypeError) as e:
        return CheckpointStatus(checkpoint_path, None, "corrupt", f"unreadable metadata.json ({e})")

    manifest_path = posixpath.join(root, MANIFEST_NAME)
    if not fs.exists(manifest_path):
        return CheckpointStatus(checkpoint_path, step, "unverified", "no manifest")
    try:
        with fs.open(manifest_path) as f:
            manifest = json.load(f)
        expected = manifest["files"]
        check_manifest_layout(manifest)
    except (ValueError, KeyError, TypeError) as e:
        return CheckpointStatus(checkpoint_path, step, "corrupt", f"unreadable manifest ({e})")

    present = list_files(fs, root)
    for rel, entry in expected.items():
        if rel not in present:
            return CheckpointStatus(checkpoint_path, step, "corrupt", f"missing file {rel}")
        if present[rel] != entry["size"]:
            return CheckpointStatus(
                checkpoint_path, step, "corrupt", f"{rel} has {present[rel]} bytes, expected {entry['size']}"
            )
        if verify_checksums and crc32c_of_file(fs, posixpath.join(root, rel)) != entry["crc32c"]:
            return CheckpointStatus(checkpoint_path, step, "corrupt", f"checksum mismatch in {rel}")
    return CheckpointStatus(checkpoint_path, step, "verified", run_info=manifest.get("run_info") or {})


def candidate_checkpoints(run_checkpoint_dir: str) -> list[str]:
    """The ``step-*`` style subdirectories of a run's checkpoint directory (and the directory itself)."""
    fs, root = fs_and_path(run_checkpoint_dir)
    if not fs.exists(root):
        return []
    dirs = [with_protocol(fs, p) for p in sorted(fs.ls(root, detail=False)) if fs.isdir(p) and _is_candidate(fs, p)]
    if fs.exists(posixpath.join(root, METADATA_NAME)):
        dirs.append(run_checkpoint_dir)
    return dirs


def _is_candidate(fs: fsspec.AbstractFileSystem, directory: str) -> bool:
    names = {posixpath.basename(p.rstrip("/")) for p in fs.ls(directory, detail=False)}  # one listing, no recursion
    if METADATA_NAME in names:
        return True
    # Quarantined in place on object storage (see .quarantine): already set aside.
    if QUARANTINE_MARKER in names:
        return False
    # A directory not named like a checkpoint (notes, a backup) is one only if it has metadata.json: without it, it is
    # not a torn checkpoint and must not be quarantined as one.
    return bool(STEP_DIR.fullmatch(posixpath.basename(directory.rstrip("/"))))


def audit_run(run_checkpoint_dir: str, *, verify_checksums: bool = True) -> list[CheckpointStatus]:
    """Every checkpoint of a run, usable ones newest (highest step) first, then the unusable ones."""
    candidates = candidate_checkpoints(run_checkpoint_dir)
    statuses = [audit_checkpoint(p, verify_checksums=verify_checksums) for p in candidates]
    usable = sorted((s for s in statuses if s.usable), key=lambda s: s.step or -1, reverse=True)
    return usable + [s for s in statuses if not s.usable]
