"""How a launcher asks a running run to stop at its next checkpoint so that it can restart it on more slices.

A run that limps (``--num_slices 2,1``: it lost a slice and goes on with fewer) should grow back when the slices
return, without losing the steps since its last checkpoint. The launcher's driver writes a *resize request* beside
the run's checkpoints (where every host of a pod, local or gs://, can read it); the run's process 0 reads it before
each checkpoint (every host follows its decision) and, if the request is for the slice count it runs on, writes that
checkpoint and stops with exit 7 (:class:`~levanter_mars.training.errors.ResizeRequested`). The launcher then starts
the next attempt on the new count, from that checkpoint. A request for another count (left from an earlier attempt)
is ignored; the driver removes it before every attempt.

Light on purpose: the Ray job's driver imports it without JAX.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Optional

from levanter_mars.training.whole_files import write_whole

RESIZE_SUFFIX = ".resize.json"


@dataclass(frozen=True)
class ResizeRequest:
    from_slices: int
    """The slice count of the attempt asked to stop: an attempt on any other count ignores the request."""
    to_slices: int
    reason: str
    requested_at: float

    def describe(self) -> str:
        return f"{self.from_slices} -> {self.to_slices} slice(s): {self.reason}"


def resize_request_path(config) -> str:
    """Beside the run's lease (``training/run/lease.py``: beside its checkpoints, named by the run)."""
    from levanter_mars.training.run.lease import LEASE_SUFFIX, lease_path

    return lease_path(config)[: -len(LEASE_SUFFIX)] + RESIZE_SUFFIX


def request(path: str, from_slices: int, to_slices: int, reason: str) -> ResizeRequest:
    asked = ResizeRequest(int(from_slices), int(to_slices), reason, time.time())
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


def pending_for(path: str, slices: int) -> Optional[ResizeRequest]:
    """The request to an attempt on ``slices`` slices, if one is pending."""
    asked = read(path)
    return asked if asked is not None and asked.from_slices == slices else None


def clear(path: str) -> None:
    from levanter_mars.training.checkpointing.storage import fs_and_path

    fs, plain = fs_and_path(path)
    try:
        fs.rm(plain)
    except FileNotFoundError:
        pass
