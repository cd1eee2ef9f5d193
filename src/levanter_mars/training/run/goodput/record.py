"""Process 0's record of a run, ``<log_dir>/<run id>/goodput.json``, read and written: the events of an attempt
(begin, steps, checkpoints, failed evaluations, its end) go into its entry, and the record is settled
(:mod:`.arithmetic`) and rewritten whole at every checkpoint, evaluation failure, at least every
``SNAPSHOT_EVERY_S`` and at the end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

from levanter_mars.training.run.goodput import arithmetic
from levanter_mars.training.run.goodput.clock import PhaseClock
from levanter_mars.training.run.metrics import METRICS_FILENAME, read_metrics
from levanter_mars.training.whole_files import write_whole

GOODPUT_FILENAME = "goodput.json"
SNAPSHOT_EVERY_S = 10.0


def _now() -> float:
    return time.time()


class GoodputRecord:
    """Process 0's record of a run; :meth:`open` adds this attempt to it."""

    def __init__(self, path: Path, clock: PhaseClock, data: dict, entry: dict):
        self.path, self.clock, self.data, self.entry = path, clock, data, entry
        self._written = 0.0

    @classmethod
    def open(cls, run_dir: os.PathLike, clock: PhaseClock, launch_id: Optional[str], *, slices: int = 1,
             slice_change: Optional[str] = None) -> "GoodputRecord":
        """``slices``: the attempt's slice count; ``slice_change``: why it differs from the attempt before (the
        launcher's words), if it does."""
        path = Path(run_dir) / GOODPUT_FILENAME
        data = read_record(path) or {"attempts": []}
        attempts = data["attempts"]
        logged = _last_logged(Path(run_dir) / METRICS_FILENAME)
        for earlier in attempts:
            if earlier.get("ended") is None:
                arithmetic.complete_dead_attempt(earlier, logged, len(attempts) + 1)
        entry = arithmetic.new_entry(attempts, launch_id, clock.started)
        entry["slices"] = int(slices)
        if slice_change:
            entry["slice_change"] = slice_change[:500]
        attempts.append(entry)
        return cls(path, clock, data, entry)

    # ------------------------------------------------------------------------------------------------ events
    def begin(self, first_step: int) -> None:
        """The attempt starts training at ``first_step``: earlier attempts' steps from there on are redone."""
        self.entry["first_step"] = int(first_step)
        self.write()

    def step_done(self, step: int) -> None:
        self.entry["last_step"] = int(step)
        if _now() - self._written >= SNAPSHOT_EVERY_S:
            self.write()

    def checkpoint_saving(self, step: int) -> None:
        """The checkpoint of ``step`` (``step`` updates done) is about to be written: a resume there keeps the
        training done so far."""
        self.entry["checkpoint_marks"][str(int(step))] = self.clock.seconds()["train"]
        self.write()

    def eval_failed(self, step: int, task: str, reason: str) -> None:
        self.entry["eval_failures"].append({"step": int(step), "task": task, "reason": reason[:500]})
        self.write()

    def preempted(self, saved_step: Optional[int], save_s: Optional[float]) -> None:
        """The attempt stops on a preemption notice, having saved ``saved_step`` (None: the save did not finish
        within the grace) in ``save_s`` seconds."""
        seconds = None if save_s is None else round(save_s, 3)
        self.entry["preemption"] = {"saved_step": saved_step, "save_seconds": seconds}

    def close(self, exit_code: int, reason: str) -> None:
        """The attempt ended. One that trained nothing and ended done (a rerun of a complete run) is no attempt: it
        leaves the record as it found it, but for dead attempts it completed."""
        if self.entry["first_step"] is None and exit_code == 0:
            self.data["attempts"].remove(self.entry)
            self._settle_and_write()
            return
        self.entry["exit_code"], self.entry["reason"] = int(exit_code), reason[:500]
        self.entry["ended_as"] = arithmetic.ended_as(self.entry)
        self.entry["ended"] = arithmetic.iso(_now())
        self.write()

    # ----------------------------------------------------------------------------------------------- writing
    def write(self) -> None:
        """Measures the attempt so far, then settles and writes the record."""
        from levanter_mars.compat.jax_compilation import cache_use

        arithmetic.measured(self.entry, self.clock.seconds(), cache_use(), _now())
        self._settle_and_write()

    def _settle_and_write(self) -> None:
        arithmetic.settle(self.data["attempts"])
        self.data.update(arithmetic.totals(self.data["attempts"]))
        write_record(self.path, self.data)
        self._written = _now()


def _last_logged(metrics_path: Path) -> Optional[tuple[float, int]]:
    """When ``metrics.jsonl`` was last written and its last step (process 0 writes it every step), if any."""
    if not metrics_path.exists():
        return None
    steps = [r["step"] for r in read_metrics(metrics_path) if isinstance(r.get("step"), int)]
    return (metrics_path.stat().st_mtime, max(steps)) if steps else None


def read_record(path: os.PathLike) -> Optional[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("attempts"), list) else None


def write_record(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data, indent=1) + "\n")
