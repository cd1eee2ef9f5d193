"""The record's arithmetic, pure: a new attempt's entry, a dead attempt completed from what it left, the training
kept and lost once later attempts resume, and the totals. Nothing here reads a clock or a file (:mod:`.record` does)."""

from __future__ import annotations

import datetime
from typing import Any, Optional

from levanter_mars.training.errors import describe_exit
from levanter_mars.training.run.goodput.clock import CATEGORIES


def iso(seconds: Optional[float]) -> Optional[str]:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="milliseconds")


def epoch(stamp: Optional[str]) -> Optional[float]:
    return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else None


def new_entry(attempts: list[dict], launch_id: Optional[str], started: float) -> dict:
    """The entry of an attempt that starts at ``started``: its number counts the attempts of its launch."""
    same_launch = [a for a in attempts if launch_id and a.get("launch_id") == launch_id]
    return {
        "launch_id": launch_id, "attempt": len(same_launch) + 1, "started": iso(started), "ended": None,
        "exit_code": None, "reason": None, "first_step": None, "last_step": None,
        "seconds": {k: 0.0 for k in CATEGORIES}, "updated": None, "checkpoint_marks": {},
        "compile_cache": {"hits": 0, "misses": 0}, "eval_failures": [],
    }  # fmt: skip


def measured(entry: dict, seconds: dict[str, float], cache_use: dict[str, int], now: float) -> None:
    """The attempt's clock and compile-cache counts so far, into its entry (``lost`` is :func:`settle`'s)."""
    entry["seconds"] = {**{k: seconds.get(k, 0.0) for k in CATEGORIES}, "lost": 0.0}
    entry["recorded_train"] = seconds["train"]
    entry["compile_cache"] = dict(cache_use)
    entry["updated"] = iso(now)


def complete_dead_attempt(entry: dict, logged: Optional[tuple[float, int]], completed_by: int) -> None:
    """An attempt that did not record its end (killed, preempted, a host lost): it ended when it was last seen, its
    last record or ``logged`` (when ``metrics.jsonl`` was last written, and its last step), whichever is later, as
    long as that log is of its steps; the time after its last record is lost."""
    updated = epoch(entry.get("updated")) or epoch(entry["started"])
    last_seen, last_step = updated, entry.get("last_step")
    first = entry.get("first_step")
    if logged is not None and logged[0] > updated and first is not None and logged[1] >= first:
        last_seen, last_step = logged
    entry["ended"] = iso(last_seen)
    entry["last_step"] = last_step
    entry["unrecorded"] = round(last_seen - updated, 3)
    entry["ended_as"] = "lost"
    entry["reason"] = (f"ended without recording it (killed, preempted, or a host was lost); completed by attempt "
                       f"{completed_by} from what it left")  # fmt: skip


def ended_as(entry: dict) -> str:
    """How a recorded attempt ended, in a word or a few: ``done``, ``preempted, saved at step N``, ``preempted, not
    saved`` (its save outlasted the grace), or its exit (``lost`` is a dead attempt's)."""
    preemption = entry.get("preemption")
    if preemption is not None:
        saved = preemption.get("saved_step")
        return "preempted, not saved" if saved is None else f"preempted, saved at step {saved}"
    return "done" if entry.get("exit_code") == 0 else describe_exit(int(entry["exit_code"]))


def steps_redone(entry: dict, later: list[dict]) -> Optional[int]:
    """How many of ``entry``'s steps the next attempt that trained redid (None: none has yet, or nothing to tell)."""
    last = entry.get("last_step")
    following = next((a["first_step"] for a in later if a.get("first_step") is not None), None)
    if last is None or following is None or entry.get("first_step") is None:
        return None
    return max(0, last + 1 - following)


def train_kept(entry: dict, resumed_at: Optional[int]) -> float:
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
    """Recomputes each attempt's ``train`` and ``lost`` from the steps later attempts resumed at, and the time its
    launch spent between the attempt before it and this one (idempotent). ``lost_detail`` itemises ``lost``: training
    ``redone`` by a later attempt, the time after a dead attempt's last record (``unrecorded``), and the time from the
    end of the launch's previous attempt to this one's start (``between_attempts``: the launcher judging, tearing down,
    waiting for slices, starting the hosts). An attempt's seconds add up to its wall time and that gap."""
    for i, entry in enumerate(attempts):
        later = [a["first_step"] for a in attempts[i + 1 :] if a.get("first_step") is not None]
        recorded = float(entry.setdefault("recorded_train", entry["seconds"].get("train", 0.0)))
        kept = train_kept(entry, min(later) if later else None)
        entry["steps_redone_next"] = steps_redone(entry, attempts[i + 1 :])
        detail = {"redone": recorded - kept, "unrecorded": float(entry.get("unrecorded", 0.0)),
                  "between_attempts": between_attempts(attempts[:i], entry)}  # fmt: skip
        entry["seconds"]["train"] = round(kept, 3)
        entry["seconds"]["lost"] = round(sum(detail.values()), 3)
        entry["lost_detail"] = {k: round(v, 3) for k, v in detail.items()}


def between_attempts(earlier: list[dict], entry: dict) -> float:
    """Seconds from the end of the latest earlier attempt of ``entry``'s launch to ``entry``'s start (0 for the first
    attempt of a launch, and for a plain command: separate launches' gaps are no one's time)."""
    launch = entry.get("launch_id")
    ends = [epoch(a.get("ended") or a.get("updated")) for a in earlier if launch and a.get("launch_id") == launch]
    ends = [end for end in ends if end is not None]
    return max(0.0, epoch(entry["started"]) - max(ends)) if ends else 0.0


def totals(attempts: list[dict]) -> dict[str, Any]:
    """``wall_seconds`` (each launch, first start to last end, summed), ``productive_seconds``, ``goodput``."""
    spans: dict[Any, list[float]] = {}
    for i, entry in enumerate(attempts):
        start = epoch(entry["started"])
        end = epoch(entry.get("ended")) or epoch(entry.get("updated")) or start
        key = entry.get("launch_id") or f"plain-{i}"
        low, high = spans.get(key, (start, end))
        spans[key] = [min(low, start), max(high, end)]
    wall = sum(high - low for low, high in spans.values())
    productive = sum(float(a["seconds"].get("train", 0.0)) for a in attempts)
    return {"wall_seconds": round(wall, 3), "productive_seconds": round(productive, 3),
            "goodput": round(productive / wall, 4) if wall > 0 else None}  # fmt: skip
