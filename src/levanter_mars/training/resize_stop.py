"""The trainer's side of a resize request (``training/run/resize.py``): look before each checkpoint (process 0 reads,
every host follows), and once asked, stop right after the next checkpoint is written whole, all hosts together."""

from __future__ import annotations

from typing import Optional

from levanter_mars.training import distributed
from levanter_mars.training.errors import ResizeRequested
from levanter_mars.training.run import resize


class ResizeAtCheckpoint:
    def __init__(self, request: Optional[tuple[str, str]]):
        self.request = request
        """(where the launch asks, its launch id); None: no launcher may ask this run."""
        self.asked: Optional[str] = None

    def look(self, slices: int) -> None:
        """Before a checkpoint of a run on ``slices`` slices: is a request for it pending?"""
        if self.request is not None and self.asked is None:
            self.asked = distributed.leader_decides(lambda: self._pending(slices))

    def _pending(self, slices: int) -> Optional[str]:
        path, launch_id = self.request
        asked = resize.pending_for(path, slices, launch_id)
        return asked.describe() if asked is not None else None

    def stop_if_asked(self, checkpointer, step: int) -> None:
        """After the checkpoint of ``step`` was started: if asked, wait for it to be whole and stop."""
        if self.asked is None:
            return
        checkpointer.wait_until_finished()
        checkpointer.raise_if_failed()
        error = ResizeRequested(f"stopped after the checkpoint of step {step}, as the launcher asked ({self.asked})")
        error.decided_together = True  # every host took process 0's decision: they leave together
        raise error
