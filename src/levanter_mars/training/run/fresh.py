"""``fresh=true``: the previous run directory, checkpoints and log file are moved aside, never deleted, once per
launch.

A launcher that retries (the pod runner after a dead host or a preemption, the plain-gcloud loop) runs the same
command again, ``fresh=true`` included. It names its launch in ``$LEVANTER_MARS_LAUNCH_ID``; the set-aside writes
that id into the new checkpoint directory, and a later attempt of the same launch that finds it resumes instead of
throwing away what the first attempt trained. Without the variable (a plain command) every invocation is a launch.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
from typing import Mapping, Optional

import fsspec

from levanter_mars.training.run.identity import checkpoint_dir, log_file, run_dir
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV

logger = logging.getLogger(__name__)

#: Written into the new run's checkpoint directory (shared by every host and attempt, local or gs://).
FRESH_MARKER = "FRESH_START.json"


def _fs(path: str):
    return fsspec.core.url_to_fs(path)[0]


def set_aside(path: str) -> Optional[str]:
    fs = _fs(path)
    if not fs.exists(path):
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    destination = f"{path.rstrip('/')}.old-{stamp}"
    suffix = 1
    while fs.exists(destination):  # two --fresh runs within a second: never move one run into another
        suffix += 1
        destination = f"{path.rstrip('/')}.old-{stamp}-{suffix}"
    if "://" in path:
        fs.mv(path, destination, recursive=True)  # object stores: a copy and a delete per object
    else:
        shutil.move(path, destination)
    logger.warning("fresh=true: moved %s to %s", path, destination)
    return destination


def _marker(config) -> str:
    return checkpoint_dir(config).rstrip("/") + "/" + FRESH_MARKER


def applied_by(config) -> Optional[str]:
    """The launch whose ``fresh=true`` started the run now in the checkpoint directory, if any."""
    try:
        with fsspec.open(_marker(config), "r") as f:
            return json.load(f).get("launch_id")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def set_aside_run(config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Moves the run directory, the run's checkpoints and its log file aside, unless this launch already did.
    Returns where they went."""
    launch_id = environ.get(LAUNCH_ID_ENV)
    if launch_id and applied_by(config) == launch_id:
        logger.warning("fresh=true was applied by an earlier attempt of this launch (%s): resuming its run", launch_id)
        return []
    paths = (str(run_dir(config)), checkpoint_dir(config), str(log_file(config)))
    moved = [m for m in (set_aside(path) for path in paths) if m]
    if launch_id:
        marker = _marker(config)
        _fs(marker).makedirs(marker.rsplit("/", 1)[0], exist_ok=True)
        with fsspec.open(marker, "w") as f:
            json.dump({"launch_id": launch_id, "set_aside": moved}, f)
    return moved
