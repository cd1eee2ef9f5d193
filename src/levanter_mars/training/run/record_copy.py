"""A finished run's record (metrics, summary, goodput) copied beside its checkpoints, at
``<checkpoint dir>/run-record/``: the run directory lives on host 0's disk, which a pod loses with its VMs, while the
checkpoint directory is shared storage (gs:// on a pod) that outlives them and that a comparison on another machine
can read. Process 0, at the end of a run."""

from __future__ import annotations

import posixpath
from pathlib import Path

from levanter_mars.training.run.goodput import GOODPUT_FILENAME
from levanter_mars.training.run.identity import checkpoint_dir, run_dir
from levanter_mars.training.run.metrics import METRICS_FILENAME
from levanter_mars.training.whole_files import write_whole

RECORD_DIR = "run-record"
SUMMARY_FILENAME = "summary.json"
COPIED = (METRICS_FILENAME, SUMMARY_FILENAME, GOODPUT_FILENAME)


def record_url(checkpoints: str, name: str) -> str:
    return posixpath.join(checkpoints.rstrip("/"), RECORD_DIR, name)


def copy_beside_checkpoints(config) -> list[str]:
    """Copies each of :data:`COPIED` that the run directory holds; returns where they went."""
    source, target = run_dir(config), checkpoint_dir(config)
    written = []
    for name in COPIED:
        path = Path(source) / name
        if path.exists():
            write_whole(record_url(target, name), path.read_bytes())
            written.append(record_url(target, name))
    return written
