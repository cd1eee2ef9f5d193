"""How each of a comparison's runs ended (``<output_dir>/records/<run id>.json``), read back by every rerun."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

from levanter_mars.compare.layout import Layout
from levanter_mars.compare.results import RunResult
from levanter_mars.compare.spec import SpecError
from levanter_mars.compare.tuning import EndedRun
from levanter_mars.training.errors import ExitCode
from levanter_mars.training.whole_files import read_json, write_whole


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    arm: str
    point: dict[str, Any]
    seed: int
    status: str
    """``ok``, ``diverged`` (a non-finite stop, exit 3, or a non-finite eval loss), ``data_exhausted`` (exit 4: the
    data ran out before the budget; the same every time, so not retried), ``failed`` (retried by the next invocation),
    ``config_error`` or ``live_elsewhere`` (its lease is held by another launch)."""
    exit_code: Optional[int]
    config_digest: str
    seconds: Optional[float]
    """Wall seconds of the process that ended the run (its start-up and compilation included)."""
    where: str
    """``local``, or the launcher's slice (``cpu x 2 hosts``, ``v4-32``)."""
    log: str
    trained_by: Optional[str] = None
    """The levanter-mars commit that ran it (``git describe``-style short id; None where unknown)."""

    def outcome(self, final_loss: Optional[float]) -> EndedRun:
        return EndedRun(self.status, final_loss)


def write_record(layout: Layout, record: RunRecord) -> None:
    write_whole(layout.record_path(record.run_id), json.dumps(asdict(record), indent=1, sort_keys=True) + "\n")


def read_record(layout: Layout, rid: str) -> Optional[RunRecord]:
    stored = read_json(layout.record_path(rid))
    return RunRecord(**stored) if stored is not None else None


def check_reusable(record: RunRecord, digest: str, layout: Layout) -> None:
    if record.config_digest != digest:
        raise SpecError(
            f"{layout.record_path(record.run_id)}: run {record.run_id} was trained with another config than this "
            "spec gives it now (arm, grid, base or overrides changed under the same name): use another --output_dir, "
            "or rename the arm"
        )


#: A run's own decided codes and what the comparison records for them (a crash, a kill or a lost host: ``failed``).
DECIDED = {ExitCode.NONFINITE_STOP: "diverged", ExitCode.CONFIG_ERROR: "config_error",
           ExitCode.DATA_EXHAUSTED: "data_exhausted", ExitCode.LIVE_ELSEWHERE: "live_elsewhere"}  # fmt: skip


def status_of(exit_code: Optional[int], result: Optional[RunResult], num_train_steps: int) -> str:
    """How a run ended, from its exit code and its metrics."""
    if exit_code in DECIDED:
        return DECIDED[exit_code]
    if exit_code != 0 or result is None or result.steps < num_train_steps or not result.curve.losses:
        return "failed"
    return "diverged" if any(v is None for v in result.curve.losses) else "ok"
