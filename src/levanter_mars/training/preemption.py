"""A preemption costs no steps: the notice (SIGTERM, some 30 s before a spot VM stops) makes every host save the same
step, and the run stops with exit 9 (``training/errors.py``), which the launchers retry at once.

* One process (no ``jax.distributed``): a SIGTERM handler, installed while training, sets a flag; the trainer looks
  at each step boundary.
* A pod: jax's preemption service catches SIGTERM on whichever host gets it (it is on by default with
  ``jax.distributed``, and a Python handler would replace its own) and the hosts agree on a step, the one
  ``reached_preemption_sync_point`` says true for on every host. It must be asked at every step, by every host.

The save goes through the resize stop's path (``resize_stop.py``: save, wait for the commit, stop together), bounded
by ``trainer.preemption_grace_s``: a save that is not committed by then is left behind torn (no manifest, never
resumed from) and the previous checkpoint stays the resume point.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from typing import Callable, Iterator, Optional

from levanter_mars.training import distributed

logger = logging.getLogger(__name__)

#: ``trainer.preemption_grace_s``'s default: a spot VM's notice is about 30 s; what is left covers leaving.
DEFAULT_GRACE_S = 25.0


class PreemptionNotice:
    def __init__(self, grace_s: float = DEFAULT_GRACE_S):
        self.grace_s = float(grace_s)
        self.noticed_at: Optional[float] = None
        """When this process learned of the notice (its SIGTERM, or the pod's agreed step): the grace runs from it."""

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        if distributed.is_multiprocess() or threading.current_thread() is not threading.main_thread():
            yield  # a pod's hosts hear it through jax's service; only the main thread may handle signals
            return
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum, frame) -> None:
        if self.noticed_at is None:
            self.noticed_at = time.monotonic()
            logger.warning("Preemption notice (SIGTERM): saving at the next step boundary, then stopping (exit 9)")

    def reached(self, step: int) -> bool:
        """At the boundary before training step ``step``: is this where every host saves?"""
        if distributed.is_multiprocess():
            from jax.experimental import multihost_utils

            if not multihost_utils.reached_preemption_sync_point(step):
                return False
            self.noticed_at = time.monotonic()
            logger.warning("Preemption notice reached the pod: every host saves at step boundary %d", step)
            return True
        return self.noticed_at is not None

    def remaining_s(self) -> float:
        return max(0.0, self.grace_s - (time.monotonic() - (self.noticed_at or time.monotonic())))


def finishes_within(wait: Callable[[], None], seconds: float) -> bool:
    """Runs ``wait`` (a checkpoint's commit) for at most ``seconds``; False if it is still going then. Its thread is
    a daemon: a process leaving past the grace does not wait for it."""
    failure: list[BaseException] = []

    def run():
        try:
            wait()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            failure.append(e)

    thread = threading.Thread(target=run, name="preemption save", daemon=True)
    thread.start()
    thread.join(seconds)
    if failure:
        raise failure[0]
    return not thread.is_alive()
