"""How a launcher asks a running run to stop at its next checkpoint so that it can restart it on more slices.

A run that limps (``--num_slices 2,1``: it lost a slice and goes on with fewer) should grow back when the slices
return, without losing the steps since its last checkpoint. The launcher's driver writes a *resize request* beside
the run's checkpoints (where every host of a pod, local or gs://, can read it); the run's process 0 reads it before
each checkpoint (every host follows its decision) and, if the request is for the slice count it runs on, writes that
checkpoint and stops with exit 7 (:class:`~levanter_mars.training.errors.ResizeRequested`). The launcher then starts
the next attempt on the new count, from that checkpoint. A request is for one launch and one slice count: one left
behind by another launch, or for another count, is ignored (the driver also removes it before every attempt and when
it ends), and a run started by no launcher never looks.

Light on purpose: the Ray job's driver imports it without JAX.
"""

from __future__ import annotations

import json
import os
import logging
import time
from dataclasses import asdict, dataclass
from typing import Optional

from levanter_mars.training.whole_files import write_whole

RESIZE_SUFFIX = ".resize.json"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResizeRequest:
    from_slices: int
    """The slice count of the attempt asked to stop: an attempt on any other count ignores the request."""
    to_slices: int
    reason: str
    requested_at: float
    launch_id: str
    """The launch whose attempt is asked (``LAUNCH_ID_ENV``)."""

    def describe(self) -> str:
        return f"{self.from_slices} -> {self.to_slices} slice(s): {self.reason}"


def resize_request_path(config) -> str:
    """Beside the run's lease (``training/run/lease.py``: beside its checkpoints, named by the run)."""
    from levanter_mars.training.run.lease import LEASE_SUFFIX, lease_path

    return lease_path(config)[: -len(LEASE_SUFFIX)] + RESIZE_SUFFIX


def for_this_launch(config) -> Optional[tuple[str, str]]:
    """(where requests to this run go, this launch's id) for a run a launcher started; None for a plain command."""
    from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV

    launch_id = os.environ.get(LAUNCH_ID_ENV)
    return (resize_request_path(config), launch_id) if launch_id else None


def request(path: str, from_slices: int, to_slices: int, reason: str, launch_id: str) -> ResizeRequest:
    asked = ResizeRequest(int(from_slices), int(to_slices), reason, time.time(), launch_id)
    write_whole(path, json.dumps(asdict(asked), indent=1))
    return asked


def read(path: str) -> Optional[ResizeRequest]:
    from levanter_mars.training.checkpointing.storage import fs_and_path

    fs, plain = fs_and_path(path)
    try:
        with fs.open(plain, "r") as f:
            return ResizeRequest(**json.load(f))
    except (FileNotFoundError, ValueError, TypeError):
        return None
    except Exception as e:  # noqa: BLE001 - a storage hiccup must not stop the run: it grows at a later checkpoint
        logger.warning("could not read the resize request %s: %s: %s", path, type(e).__name__, e)
        return None


def pending_for(path: str, slices: int, launch_id: str) -> Optional[ResizeRequest]:
    """The request to this launch's attempt on ``slices`` slices, if one is pending."""
    asked = read(path)
    if asked is None or asked.from_slices != slices or asked.launch_id != launch_id:
        return None
    return asked


def clear(path: str) -> None:
    """Removes the request at ``path`` if there is one; raises StorageError (exit 5's kind) if the storage fails."""
    from levanter_mars.training.checkpointing.storage import fs_and_path
    from levanter_mars.training.errors import StorageError

    try:
        fs, plain = fs_and_path(path)
        fs.rm(plain)
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - the storage's trouble, whatever the client calls it
        raise StorageError(f"cannot clear the resize request {path}: {type(e).__name__}: {e}") from e
