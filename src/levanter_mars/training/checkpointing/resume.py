"""Which checkpoint a run resumes from, decided once by process 0 for every host.

Process 0 audits the run's checkpoints (manifests, checksums), quarantines the incomplete and corrupt ones and
checks that the newest usable one was written by a compatible optimizer, all before any other host reads the
directory. The others wait for its answer, then every host tries the same checkpoint; if any host cannot load it,
all move on to the previous one together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from levanter_mars.training import distributed
from levanter_mars.training.checkpointing.audit import audit_run
from levanter_mars.training.checkpointing.compatibility import check_compatible
from levanter_mars.training.checkpointing.quarantine import quarantine
from levanter_mars.training.checkpointing.writer import state_is_finite
from levanter_mars.training.errors import CheckpointError, CheckpointMismatchError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePlan:
    checkpoint_dir: str
    candidates: tuple[dict, ...]
    """Usable checkpoints, newest first: ``{"path", "step", "state"}``."""
    quarantined: int
    """How many checkpoints process 0 set aside while auditing."""


def plan_resume(checkpoint_dir: str, run_info: dict, *, verify_checksums: bool) -> ResumePlan:
    """Process 0 audits and quarantines; every process returns the same plan (or raises the same error)."""

    def decide() -> dict:
        usable, quarantined = [], 0
        for status in audit_run(checkpoint_dir, verify_checksums=verify_checksums):
            if status.usable:
                usable.append(status)
                continue
            logger.warning("Skipping %s checkpoint %s: %s", status.state, status.path, status.reason)
            quarantine(status.path, f"{status.state}: {status.reason}")
            quarantined += 1
        if usable:  # before anything is built or compiled
            check_compatible(usable[0], run_info)
        candidates = [{"path": s.path, "step": s.step, "state": s.state} for s in usable]
        return {"candidates": candidates, "quarantined": quarantined}

    decided = distributed.leader_decides(decide)
    return ResumePlan(checkpoint_dir, tuple(decided["candidates"]), decided["quarantined"])


def load_first_usable(plan: ResumePlan, load: Callable[[str], object]) -> Optional[object]:
    """The state of the newest candidate that every host loads and that is finite, or None.

    ``load(path)`` loads on this host. A candidate that fails anywhere is quarantined by process 0 once all hosts
    have stopped reading it; a verified checkpoint that does not load is an error (a changed config), not damage.
    """
    quarantined = plan.quarantined
    for candidate in plan.candidates:
        path = candidate["path"]
        state, failure, error = None, None, None
        try:
            state = load(path)
        except Exception as e:  # noqa: BLE001 - any failure to load means try the previous checkpoint
            failure, error = f"{type(e).__name__}: {e}", e
            logger.warning("Checkpoint %s does not load here (%s)", path, failure)
        if not distributed.all_processes(failure is None):
            if candidate["state"] == "verified":
                # Another config fails on process 0 as on every host, and not as the storage does; what failed on
                # another host only, or as a read, is that host's or the storage's trouble (exit 5, retried).
                storage = distributed.leader_decides(lambda: error is None or isinstance(error, OSError))
                raise (CheckpointError if storage else CheckpointMismatchError)(
                    f"checkpoint {path} is intact (its manifest verifies) but does not load into this run's state "
                    f"({failure or 'failed on another host'}). "
                    + ("Rerun to retry." if storage else "Was the model or optimizer config changed?")
                )
            _quarantine_on_leader(path, f"failed to load: {failure or 'on another host'}")
            quarantined += 1
            continue
        if not bool(state_is_finite(state.saveable_state)):  # a global reduction: the same answer on every host
            logger.warning("Checkpoint %s holds NaN/Inf; trying the previous one", path)
            _quarantine_on_leader(path, "state contains NaN/Inf")
            quarantined += 1
            continue
        logger.info("Resuming from %s (step %s, %s)", path, int(state.step), candidate["state"])
        return state
    if quarantined:  # every checkpoint was bad: say so, not only "No checkpoint found"
        logger.error(
            "No usable checkpoint left in %s (%d quarantined in %s.quarantine): starting from scratch",
            plan.checkpoint_dir, quarantined, plan.checkpoint_dir.rstrip("/"),
        )
    return None


def _quarantine_on_leader(path: str, reason: str) -> None:
    distributed.leader_decides(lambda: quarantine(path, reason))
