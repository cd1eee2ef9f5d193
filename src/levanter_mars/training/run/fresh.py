"""``fresh=true``: the previous run directory and checkpoints are moved aside, never deleted."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
from typing import Optional

from levanter_mars.training.run.identity import checkpoint_dir, run_dir

logger = logging.getLogger(__name__)


def set_aside(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    destination = f"{path.rstrip('/')}.old-{stamp}"
    suffix = 1
    while os.path.exists(destination):  # two --fresh runs within a second: never move one run into another
        suffix += 1
        destination = f"{path.rstrip('/')}.old-{stamp}-{suffix}"
    shutil.move(path, destination)
    logger.warning("fresh=true: moved %s to %s", path, destination)
    return destination


def set_aside_run(config) -> list[str]:
    """Moves the run directory and the run's checkpoints aside. Returns where they went."""
    moved = [set_aside(path) for path in (str(run_dir(config)), checkpoint_dir(config))]
    return [m for m in moved if m]
