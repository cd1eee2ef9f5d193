"""The trainer's side of the stops that end a run at a checkpoint, all hosts together: a resize request
(``training/run/resize.py``: looked at before each checkpoint, process 0 reads, every host follows; once asked, stop
right after the next checkpoint is written whole) and a preemption notice (``training/preemption.py``: the step
boundary every host agreed on is saved at once, within the grace)."""

from __future__ import annotations

import logging
import time
from typing import Optional

from levanter.callbacks import StepInfo

from levanter_mars.training import distributed
from levanter_mars.training.errors import Preempted, ResizeRequested
from levanter_mars.training.preemption import PreemptionNotice, finishes_within
from levanter_mars.training.run import resize
from levanter_mars.training.run.goodput import clock as goodput_clock

logger = logging.getLogger(__name__)


class StopAtCheckpoint:
    def __init__(self, request: Optional[tuple[str, str]], preemption: Optional[PreemptionNotice] = None):
        self.request = request
        """(where the launch asks, its launch id); None: no launcher may ask this run."""
        self.asked: Optional[str] = None
        self.preemption = preemption

    def look(self, slices: int) -> None:
        """Before a checkpoint of a run on ``slices`` slices: is a request for it pending?"""
        if self.request is not None and self.asked is None:
            self.asked = distributed.leader_decides(lambda: self._pending(slices))

    def _pending(self, slices: int) -> Optional[str]:
        path, launch_id = self.request
        asked = resize.pending_for(path, slices, launch_id)
        return asked.describe() if asked is not None else None

    def stop_if_asked(self, checkpointer, state) -> None:
        """At the boundary before the step of ``state`` (its previous step's checkpoint, if due, was started): if
        preempted, save that step and stop; if asked to resize, wait for the checkpoint to be whole and stop."""
        step = int(state.step) - 1  # Levanter names a checkpoint by its last step
        if self.preemption is not None and self.preemption.reached(int(state.step)):
            self._stop_preempted(checkpointer, state, step)
        if self.asked is None:
            return
        self._stop(checkpointer, ResizeRequested(
            f"stopped after the checkpoint of step {step}, as the launcher asked ({self.asked})"))

    def _stop_preempted(self, checkpointer, state, step: int) -> None:
        started = time.monotonic()
        if step < 0:
            error = Preempted("preempted before the first step: nothing to save")
        else:
            # Saved once: a checkpoint of this step already written (a periodic one, the one resumed from) is kept.
            with goodput_clock.phase("checkpoint"):
                checkpointer.on_step(StepInfo(state, float("nan"), 0.0), force=True)
                committed = finishes_within(checkpointer.wait_until_finished, self.preemption.remaining_s())
            if committed:
                error = Preempted(f"preempted: saved at step {step}")
                error.saved_step = step
            else:
                error = Preempted(
                    f"preempted: the checkpoint of step {step} was not written within trainer.preemption_grace_s="
                    f"{self.preemption.grace_s:g} s; the previous checkpoint is the resume point (the torn one has "
                    "no manifest and is never resumed from)"
                )
                error.leave_now = True  # its write is still going: nobody waits for it again
        error.save_s = time.monotonic() - started
        logger.warning("%s (%.1f s)", error, error.save_s)
        self._stop(checkpointer, error, wait=False)

    @staticmethod
    def _stop(checkpointer, error: Exception, wait: bool = True) -> None:
        if wait:
            checkpointer.wait_until_finished()
        if not getattr(error, "leave_now", False):
            checkpointer.raise_if_failed()
        error.decided_together = True  # every host took the same decision: they leave together
        raise error
