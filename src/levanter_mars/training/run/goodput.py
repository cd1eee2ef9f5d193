"""``<log_dir>/<run id>/goodput.json``: where a run's time went, attempt by attempt, kept by process 0.

```
{"attempts": [{"launch_id", "attempt", "started", "ended", "exit_code", "reason", "first_step", "last_step",
               "seconds": {"startup", "compile", "train", "checkpoint", "eval", "lost"}, ...}],
 "wall_seconds", "productive_seconds", "goodput"}
```

An attempt's seconds add up to its wall time (``ended - started``); the measured ones come from its clock
(:mod:`.goodput_clock`). ``lost`` is what no later attempt keeps: the training of steps redone after a restart (the
steps after the checkpoint the next attempt resumed from), plus, for an attempt that died without recording its end,
the time after its last record (its steps after that were redone too). ``train`` is the training time kept;
``productive_seconds`` sums it, and ``goodput = productive_seconds / wall_seconds``. ``wall_seconds`` spans each launch
from its first attempt's start to its last attempt's end (the launcher's restarts included); separate launches (a plain
rerun of the command) add up, the time between them does not count.

The record is rewritten whole (temporary file, then rename) at every checkpoint, evaluation failure, at least every
``SNAPSHOT_EVERY_S`` and at the end. An attempt killed with any host, process 0 included, leaves its last snapshot; the
next attempt completes it from that snapshot and from ``metrics.jsonl`` (its last step, and its time: process 0 writes
it every step), and decides what was lost from the step it resumes at.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from levanter_mars.training.run.goodput_clock import CATEGORIES, PhaseClock
from levanter_mars.training.run.metrics import METRICS_FILENAME, read_metrics
from levanter_mars.training.whole_files import write_whole

GOODPUT_FILENAME = "goodput.json"
SNAPSHOT_EVERY_S = 10.0


def _now() -> float:
    return time.time()


def _iso(seconds: Optional[float]) -> Optional[str]:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _epoch(iso: Optional[str]) -> Optional[float]:
    return datetime.datetime.fromisoformat(iso).timestamp() if iso else None


class GoodputRecord:
    """Process 0's record of a run; :meth:`open` adds this attempt to it."""

    def __init__(self, path: Path, clock: PhaseClock, data: dict, entry: dict):
        self.path, self.clock, self.data, self.entry = path, clock, data, entry
        self._written = 0.0

    @classmethod
    def open(cls, run_dir: os.PathLike, clock: PhaseClock, launch_id: Optional[str]) -> "GoodputRecord":
        path = Path(run_dir) / GOODPUT_FILENAME
        data = read_record(path) or {"attempts": []}
        attempts = data["attempts"]
        for earlier in attempts:
            if earlier.get("ended") is None:
                complete_dead_attempt(earlier, Path(run_dir) / METRICS_FILENAME, len(attempts) + 1)
        same_launch = [a for a in attempts if launch_id and a.get("launch_id") == launch_id]
        entry = {
            "launch_id": launch_id, "attempt": len(same_launch) + 1, "started": _iso(clock.started), "ended": None,
            "exit_code": None, "reason": None, "first_step": None, "last_step": None,
            "seconds": {k: 0.0 for k in CATEGORIES}, "updated": None, "checkpoint_marks": {},
            "compile_cache": {"hits": 0, "misses": 0}, "eval_failures": [],
        }  # fmt: skip
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
        self.entry["checkpoint_marks"][str(int(step))] = self._measured()["train"]
        self.write()

    def eval_failed(self, step: int, task: str, reason: str) -> None:
        self.entry["eval_failures"].append({"step": int(step), "task": task, "reason": reason[:500]})
        self.write()

    def close(self, exit_code: int, reason: str) -> None:
        self.entry["exit_code"], self.entry["reason"] = int(exit_code), reason[:500]
        self.entry["ended"] = _iso(_now())
        self.write()

    # ----------------------------------------------------------------------------------------------- writing
    def _measured(self) -> dict[str, float]:
        return self.clock.seconds()

    def write(self) -> None:
        from levanter_mars.compat.jax_compilation import cache_use

        measured = self._measured()
        self.entry["seconds"] = {**{k: measured.get(k, 0.0) for k in CATEGORIES}, "lost": 0.0}
        self.entry["recorded_train"] = measured["train"]
        self.entry["compile_cache"] = cache_use()
        self.entry["updated"] = _iso(_now())
        settle(self.data["attempts"])
        self.data.update(totals(self.data["attempts"]))
        write_record(self.path, self.data)
        self._written = _now()


def read_record(path: os.PathLike) -> Optional[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("attempts"), list) else None


def write_record(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data, indent=1) + "\n")


def complete_dead_attempt(entry: dict, metrics_path: Path, completed_by: int) -> None:
    """An attempt that did not record its end (killed, preempted, a host lost): it ended when it was last seen, its
    last record or its last line of ``metrics.jsonl``, whichever is later; the time after its last record is lost."""
    updated = _epoch(entry.get("updated")) or _epoch(entry["started"])
    last_seen, last_step = updated, entry.get("last_step")
    if metrics_path.exists() and metrics_path.stat().st_mtime > updated:
        logged = [r["step"] for r in read_metrics(metrics_path) if isinstance(r.get("step"), int)]
        first = entry.get("first_step")
        if logged and first is not None and max(logged) >= first:
            last_seen, last_step = metrics_path.stat().st_mtime, max(logged)
    entry["ended"] = _iso(last_seen)
    entry["last_step"] = last_step
    entry["unrecorded"] = round(last_seen - updated, 3)
    entry["reason"] = (f"ended without recording it (killed, preempted, or a host was lost); completed by attempt "
                       f"{completed_by} from what it left")  # fmt: skip


def _train_kept(entry: dict, resumed_at: Optional[int]) -> float:
    """Training seconds of ``entry`` that a resume at step ``resumed_at`` keeps (steps before it)."""
    recorded = float(entry.get("recorded_train", entry["seconds"].get("train", 0.0)))
    first, last = entry.get("first_step"), entry.get("last_step")
    if resumed_at is None or first is None or last is None or resumed_at > last:
        return recorded
    if resumed_at <= first:
        return 0.0
    marks = {int(k): float(v) for k, v in (entry.get("checkpoint_marks") or {}).items()}
    if resumed_at in marks:
        return min(marks[resumed_at], recorded)
    # Not a checkpoint this attempt wrote a mark for (cannot happen for its own checkpoints): by the step count.
    return recorded * (resumed_at - first) / max(1, last + 1 - first)


def settle(attempts: list[dict]) -> None:
    """Recomputes each attempt's ``train`` and ``lost`` from the steps later attempts resumed at (idempotent)."""
    for i, entry in enumerate(attempts):
        later = [a["first_step"] for a in attempts[i + 1 :] if a.get("first_step") is not None]
        recorded = float(entry.setdefault("recorded_train", entry["seconds"].get("train", 0.0)))
        kept = _train_kept(entry, min(later) if later else None)
        entry["seconds"]["train"] = round(kept, 3)
        entry["seconds"]["lost"] = round(recorded - kept + float(entry.get("unrecorded", 0.0)), 3)


def totals(attempts: list[dict]) -> dict[str, Any]:
    """``wall_seconds`` (each launch, first start to last end, summed), ``productive_seconds``, ``goodput``."""
    spans: dict[Any, list[float]] = {}
    for i, entry in enumerate(attempts):
        start = _epoch(entry["started"])
        end = _epoch(entry.get("ended")) or _epoch(entry.get("updated")) or start
        key = entry.get("launch_id") or f"plain-{i}"
        low, high = spans.get(key, (start, end))
        spans[key] = [min(low, start), max(high, end)]
    wall = sum(high - low for low, high in spans.values())
    productive = sum(float(a["seconds"].get("train", 0.0)) for a in attempts)
    return {"wall_seconds": round(wall, 3), "productive_seconds": round(productive, 3),
            "goodput": round(productive / wall, 4) if wall > 0 else None}  # fmt: skip
