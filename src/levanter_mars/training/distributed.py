"""One process decides, every process acts on the same answer.

On a pod every host runs this program. Whatever touches shared files (checkpoint audits, quarantine moves,
set-asides, caches, metrics) is done by process 0 alone, and what it decided reaches the others before they read
anything; an error process 0 hits is raised on every process, with the same message. A pod's start (joining
``jax.distributed``) is ``pod_start.py``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, TypeVar

import jax
import numpy as np

from levanter_mars.training.errors import shared_error_class

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: How long a host waits for process 0's decision (an audit that reads every checkpoint file, a cache build).
DECISION_TIMEOUT_S = 3600.0


def is_leader() -> bool:
    return jax.process_index() == 0


def is_multiprocess() -> bool:
    # Without jax.distributed there is one process: asking JAX would start a backend (the launcher validates configs
    # without one).
    return jax.distributed.is_initialized() and jax.process_count() > 1


def leader_decides(decide: Callable[[], T]) -> T:
    """Runs ``decide`` on process 0 and returns its (JSON-able) result on every process, or raises its error."""
    from levanter.utils.jax_utils import multihost_broadcast_sync

    if not is_multiprocess():
        return decide()
    outcome: Any = None
    if is_leader():
        try:
            outcome = {"value": decide()}
        except Exception as e:  # noqa: BLE001 - every process raises it below
            outcome = {"error": type(e).__name__, "message": str(e)}
            leader_error = e
    outcome = multihost_broadcast_sync(outcome, timeout=DECISION_TIMEOUT_S)
    if "error" in outcome:
        error = leader_error if is_leader() else shared_error_class(outcome["error"])(outcome["message"])
        error.decided_together = True  # every process stops with it: they may leave together (exit_now)
        raise error
    return outcome["value"]


def all_processes(flag: bool) -> bool:
    """True on every process if ``flag`` is true on every process. A collective: all must call it."""
    if not is_multiprocess():
        return flag
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.array([flag]))))


def exit_now(code: int, together: bool = False) -> None:
    """Ends this process without jax.distributed's shutdown barrier, which would wait minutes for peers that may be
    dead or blocked in a collective; the peers end when this process's heartbeats stop. ``together``: every process
    stops with the same decision (:func:`leader_decides`), so all take the shutdown barrier: process 0's coordination
    service then outlives its peers' last read of the decision, which they would otherwise die reading (defect 46)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    if together and is_multiprocess():
        try:
            jax.distributed.shutdown()
        except Exception:  # noqa: BLE001 - leaving anyway; the code says why
            pass
    os._exit(code)
