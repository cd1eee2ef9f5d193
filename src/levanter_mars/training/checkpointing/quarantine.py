"""Bad checkpoints set aside under ``<checkpoint dir>.quarantine/`` (never deleted), so that neither Levanter's
discovery nor our audit uses them again.

On local disk the whole directory is renamed there. Object storage has no rename (a "move" copies and deletes every
object: minutes for thousands of objects, while every host waits), so there the quarantine costs a constant number of
object operations, whatever the checkpoint's size:

* ``metadata.json`` and the manifest are moved into ``<checkpoint dir>.quarantine/step-N.<time>/``, with
  ``QUARANTINE_REASON.txt``: without ``metadata.json``, Levanter's discovery no longer sees the checkpoint;
* a marker, ``QUARANTINED.json``, is written into the checkpoint's own prefix: the audit skips a marked prefix that
  has no ``metadata.json``;
* the arrays stay where they are until a later save of the same step rewrites them (docs/reliability.md says how to
  restore one by hand).

A marked prefix that has a ``metadata.json`` again was saved anew after the quarantine and is audited as usual (the
checkpointer removes the stale marker when it commits).
"""

from __future__ import annotations

import datetime
import json
import logging
import posixpath

import fsspec

from levanter_mars.training.checkpointing.storage import (
    MANIFEST_NAME,
    METADATA_NAME,
    QUARANTINE_MARKER,
    REASON_NAME,
    fs_and_path,
    is_local,
    with_protocol,
    write_text,
)

logger = logging.getLogger(__name__)


def quarantine(checkpoint_path: str, reason: str) -> str:
    """Sets a bad checkpoint aside under ``<run dir>.quarantine/``, keeping it for inspection. Returns where its
    record went. Local disk: the directory is renamed there. Object storage: a constant number of object operations
    (see the module docstring)."""
    fs, root = fs_and_path(checkpoint_path)
    parent, name = posixpath.split(root.rstrip("/"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    destination_dir = parent + ".quarantine"
    fs.makedirs(destination_dir, exist_ok=True)
    destination = posixpath.join(destination_dir, f"{name}.{stamp}")
    if is_local(fs):
        fs.mv(root, destination, recursive=True)
        write_text(fs, posixpath.join(destination, REASON_NAME), reason + "\n")
    else:
        _quarantine_in_place(fs, root, destination, reason)
    logger.warning("Quarantined checkpoint %s -> %s: %s", checkpoint_path, with_protocol(fs, destination), reason)
    return with_protocol(fs, destination)


def _quarantine_in_place(fs: fsspec.AbstractFileSystem, root: str, destination: str, reason: str) -> None:
    """Copies first, deletes last: interrupted anywhere, the checkpoint is either still whole (and quarantined again
    on the next audit) or set aside, never lost."""
    small = [n for n in (METADATA_NAME, MANIFEST_NAME) if fs.exists(posixpath.join(root, n))]
    for n in small:
        fs.copy(posixpath.join(root, n), posixpath.join(destination, n))
    arrays = fs.unstrip_protocol(root)
    write_text(fs, posixpath.join(destination, REASON_NAME), (
        f"{reason}\n\nQuarantined in place (object storage): the arrays stay under {arrays}/ until a later save of "
        f"the same step rewrites them; {', '.join(small) or 'nothing else'} moved here. To restore: copy them back "
        f"into {arrays}/ and delete {arrays}/{QUARANTINE_MARKER} (docs/reliability.md).\n"
    ))
    write_text(fs, posixpath.join(root, QUARANTINE_MARKER), json.dumps(
        {"reason": reason, "moved_to": fs.unstrip_protocol(destination), "moved": small}, indent=1
    ))
    for n in small:  # metadata.json first: from then on Levanter's discovery no longer sees the checkpoint
        fs.rm(posixpath.join(root, n))


def clear_quarantine_marker(checkpoint_path: str) -> None:
    """Removes the marker a quarantine in place left, once a new checkpoint of the same step is committed there."""
    fs, root = fs_and_path(checkpoint_path)
    marker = posixpath.join(root, QUARANTINE_MARKER)
    if not is_local(fs) and fs.exists(marker):
        fs.rm(marker)
