"""NaN/Inf steps: reported, counted, and stopping the run when the policy says so."""

from __future__ import annotations

import logging

from levanter.callbacks import Callback

from levanter_mars.optim.guard import NonFiniteGuardState
from levanter_mars.training.errors import NonFiniteTrainingError

logger = logging.getLogger(__name__)

NONFINITE_POLICIES = ("skip", "stop")


class NonFiniteMonitor(Callback):
    """Runs before the checkpointer: reports skipped steps (and values that would have been written NaN/Inf from
    finite inputs, which the guard kept at their previous value) and stops the run when the policy says so."""

    def __init__(self, policy: str, max_consecutive: int):
        self.policy = policy
        self.max_consecutive = max_consecutive
        self._seen = None
        self._outputs_seen = None

    def on_step(self, info, force: bool = False):
        guard = info.state.opt_state
        if not isinstance(guard, NonFiniteGuardState):
            return
        self._report_outputs(info.step, float(guard.nonfinite_outputs))
        skipped, consecutive = int(guard.skipped_steps), int(guard.consecutive_skips)
        if self._seen is None:
            self._seen = skipped - (1 if consecutive else 0)
        if skipped <= self._seen:
            return
        self._seen = skipped
        message = (
            f"step {info.step}: NaN/Inf in the gradients (loss = {info.loss}); the update was skipped ({skipped} "
            f"skipped so far, {consecutive} in a row)"
        )
        if self.policy == "stop":
            raise NonFiniteTrainingError(
                message + ". Stopping (trainer.nonfinite=stop). No checkpoint was written for this step; rerun the "
                "same command to resume from the last checkpoint, or set trainer.nonfinite=skip."
            )
        if consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                message + f". Stopping: trainer.max_consecutive_nonfinite={self.max_consecutive} reached."
            )
        logger.warning(message)

    def _report_outputs(self, step: int, total: float) -> None:
        previous, self._outputs_seen = self._outputs_seen, total
        if previous is not None and total > previous:
            logger.warning(
                "step %d: %d value(s) that would have been NaN/Inf (optimizer state, or a parameter after its "
                "update) were kept at their previous value, from finite gradients; counted in optim/nonfinite_outputs "
                "(%d so far)",
                step, int(total - previous), int(total),
            )  # fmt: skip
