"""``metrics.jsonl``: one JSON object per logged step, in every run directory, whatever tracker is configured."""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import numpy as np
from levanter.tracker import Tracker

from levanter_mars.training.whole_files import write_whole

logger = logging.getLogger(__name__)

METRICS_FILENAME = "metrics.jsonl"


def _to_json_scalar(value: Any) -> Any:
    """Python scalars for JSON; None for anything that is not a scalar (histograms, tables, arrays)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else str(value)  # JSON has no NaN; keep it visible as "nan"
    if hasattr(value, "shape") and getattr(value, "shape", None) == () and hasattr(value, "item"):
        return _to_json_scalar(value.item())
    if isinstance(value, str):
        return value
    return None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a torn last line, from a killed process, is ignored)."""
    return list(_complete_records(Path(path)))


def _complete_records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn write
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                break


class JsonlMetricsTracker(Tracker):
    """Appends ``{"step": N, ...}`` lines to ``metrics.jsonl``.

    Levanter logs one step's metrics in several calls (loss, learning rates, eval loss, throughput), so metrics are
    merged per step and a line is written when a later step begins or the tracker finishes. Each line is flushed
    and fsynced, so a killed run leaves at most a torn last line; :meth:`truncate_after` then drops it, together
    with the steps a resumed run will redo, so that a resumed run's file reads as if it had never stopped.
    """

    name = "metrics_jsonl"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._pending_step: Optional[int] = None
        self._pending: dict[str, Any] = {}
        self._summary: dict[str, Any] = {}
        # The last line written and where it starts, so that late metrics of the same step (an end-of-run
        # evaluation, say) are merged into it rather than repeating the step.
        self._last_record: Optional[dict[str, Any]] = None
        self._last_offset: int = 0

    def truncate_after(self, last_kept_step: int) -> None:
        """Keeps the records with ``step <= last_kept_step``: call when a run resumes from a checkpoint."""
        self._pending_step, self._pending = None, {}
        if not self.path.exists():
            return
        kept = [r for r in _complete_records(self.path) if int(r.get("step", -1)) <= last_kept_step]
        write_whole(self.path, "".join(json.dumps(record, sort_keys=True) + "\n" for record in kept))
        self._pending_step, self._pending = None, {}
        self._last_record = None

    def log_hyperparameters(self, hparams: dict[str, Any]):
        pass

    def log(self, metrics: Mapping[str, Any], *, step: Optional[int], commit: Optional[bool] = None):
        if step is None:
            # Like W&B: the current step. Levanter logs eval-harness results this way.
            step = self._pending_step if self._pending_step is not None else (self._last_record or {}).get("step")
            if step is None:
                return
        step = int(step)
        if self._pending_step is not None and step != self._pending_step:
            self._write_pending()
        self._pending_step = step
        for key, value in metrics.items():
            scalar = _to_json_scalar(value)
            if scalar is not None:
                self._pending[key] = scalar

    def log_summary(self, metrics: dict[str, Any]):
        self._summary.update({k: v for k, v in ((k, _to_json_scalar(v)) for k, v in metrics.items()) if v is not None})

    def log_artifact(self, artifact_path, *, name: Optional[str] = None, type: Optional[str] = None):
        pass

    def flush(self) -> None:
        self._write_pending()

    def finish(self):
        self._write_pending()
        if self._summary:
            summary = json.dumps(self._summary, indent=2, sort_keys=True) + "\n"
            write_whole(self.path.with_name("summary.json"), summary)

    def _write_pending(self) -> None:
        if self._pending_step is None or not self._pending:
            return
        record = {"step": self._pending_step, **self._pending}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+") as f:
            if self._last_record is not None and self._last_record["step"] == record["step"]:
                record = {**self._last_record, **record}
                f.truncate(self._last_offset)
            f.seek(0, os.SEEK_END)
            self._last_offset = f.tell()
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._last_record = record
        self._pending_step, self._pending = None, {}
