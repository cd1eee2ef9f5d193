"""Which slice count each attempt of a run runs on, and when a run that limps grows back (``--num_slices 2,1``).

The first attempt waits for the largest count's slices (on a TPU cluster the autoscaler starts them: the driver keeps
a demand for them), with several allowed counts no longer than ``scale_up_wait_s``. A retry runs on the largest
allowed count whose slices are up now, waiting for the smallest if none is, so a preempted slice costs one restart,
not a wait for its return. While an attempt runs on fewer slices than the largest count, a
:class:`ScaleUpWatch` waits ``scale_up_wait_s``; once more slices are up, it asks the run to stop at its next
checkpoint (``training/run/resize.py``), and the next attempt takes them. Each attempt's change of count, and why,
reaches the run's goodput record (``SLICE_CHANGE_ENV``).

Light: no JAX. ``present`` (how many slices are up) is a function, so the choices are tested without a cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, Sequence

from levanter_mars.training.errors import ExitCode
from levanter_mars.training.run import resize

logger = logging.getLogger("levanter_mars.infra.slice_choice")

PresentSlices = Callable[[], int]
#: How long a retry after a preemption waits for Ray to see a slice gone before it counts the slices up. A node that
#: shuts down (a preempted VM, `local_cluster preempt`) is gone at once; one that vanishes silently is counted until
#: Ray's health checks give up on it (its defaults: about 30 s). Counting it would ask for a slice that is not there.
PREEMPTION_SETTLE_S = 30.0
#: The same after hosts ended by a signal (a preemption's SIGTERM reaches the training process first), or saved on a
#: preemption's notice (exit 9): its slice goes some 30 s after the notice, maybe not yet; the retry is at once.
SIGNAL_SETTLE_S = 5.0


def largest_up(counts: Sequence[int], present: int) -> Optional[int]:
    """The largest allowed count with ``present`` slices up, if any."""
    return next((count for count in sorted(counts, reverse=True) if count <= present), None)


def wait_for_slices(counts: Sequence[int], present: PresentSlices, poll_s: float = 5.0, say=logger.info) -> int:
    """The largest allowed count that is up, waiting for the smallest if none is (said once a minute)."""
    said = 0.0
    while (count := largest_up(counts, present())) is None:
        if time.monotonic() - said >= 60:
            say(f"waiting for slices: {present()} up, the run needs at least {min(counts)}")
            said = time.monotonic()
        time.sleep(poll_s)
    return count


def first_count(counts: Sequence[int], present: PresentSlices, wait_s: float, poll_s: float = 5.0) -> int:
    """The first attempt's count: the largest once its slices are up; with several allowed, after ``wait_s``
    whatever is up (the largest allowed count of it)."""
    deadline = time.monotonic() + wait_s
    while len(counts) > 1 and present() < counts[0] and time.monotonic() < deadline:
        time.sleep(poll_s)
    return wait_for_slices(counts if len(counts) > 1 else counts[:1], present, poll_s)


def next_count(counts: Sequence[int], previous: Optional[int], exits: Sequence[Optional[int]],
               present: PresentSlices) -> int:  # fmt: skip
    """The count of a retry after an attempt on ``previous`` slices whose hosts ended with ``exits`` (None: lost)."""
    if previous is not None and any(code is None for code in exits):
        settle_after_preemption(previous, present)
    elif previous is not None and any(code < 0 or code >= 128 or code == ExitCode.PREEMPTED for code in exits):
        settle_after_preemption(previous, present, settle_s=SIGNAL_SETTLE_S)
    return wait_for_slices(counts, present)


def settle_after_preemption(was: int, present: PresentSlices, settle_s: float = PREEMPTION_SETTLE_S,
                            poll_s: float = 1.0) -> int:
    """Slices up after an attempt on ``was`` slices lost a host: as soon as fewer are up (a slice is gone), or after
    ``settle_s`` (a host lost, its slice still up)."""
    deadline = time.monotonic() + settle_s
    while (up := present()) >= was and time.monotonic() < deadline:
        time.sleep(poll_s)
    return up


def change_note(previous: Optional[int], now: int, why: str) -> Optional[str]:
    """What the goodput record says of an attempt on ``now`` slices after one on ``previous`` (None: no change)."""
    if previous is None or previous == now:
        return None
    return f"{previous} -> {now} slice(s): {why}"


class ScaleUpWatch:
    """While an attempt runs on ``current`` slices, fewer than allowed: after ``wait_s``, as soon as the next
    larger count's slices are up, asks the run (``request_path``) to stop at its next checkpoint. A context
    manager: the watch ends with the attempt."""

    def __init__(self, counts: Sequence[int], current: int, present: PresentSlices, wait_s: float,
                 request_path: str, launch_id: str, poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.larger = sorted(c for c in counts if c > current)
        self.current, self.present, self.wait_s = current, present, wait_s
        self.request_path, self.launch_id, self.poll_s, self.clock = request_path, launch_id, poll_s, clock
        self.asked: Optional[resize.ResizeRequest] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="scale-up-watch", daemon=True)

    def check(self, since: float) -> Optional[resize.ResizeRequest]:
        """One look: asks for the largest allowed count now up, once ``wait_s`` has passed since ``since``."""
        if self.asked is not None or not self.larger or self.clock() - since < self.wait_s:
            return None
        up = self.present()
        target = largest_up(self.larger, up)
        if target is None:
            return None
        why = (f"{up} slice(s) up again after {self.clock() - since:.0f} s on {self.current} "
               f"(scale_up_wait_s {self.wait_s:g}); stopped at its next checkpoint to grow")  # fmt: skip
        self.asked = resize.request(self.request_path, self.current, target, why, self.launch_id)
        logger.info("asked the run to stop at its next checkpoint and grow: %s", self.asked.describe())
        return self.asked

    def _watch(self) -> None:
        since = self.clock()
        while not self._stop.wait(self.poll_s):
            try:
                if self.check(since) is not None:
                    return
            except Exception as e:  # noqa: BLE001 - a failed look (storage, Ray) is tried again; the run goes on
                logger.warning("scale-up watch: %s: %s", type(e).__name__, e)

    def __enter__(self) -> "ScaleUpWatch":
        if self.larger:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
