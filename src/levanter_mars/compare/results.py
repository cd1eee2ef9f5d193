"""What a run left for the comparison to measure: its eval curve and its pace, from its metrics."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Optional

import fsspec

from levanter_mars.compare.layout import Layout
from levanter_mars.compare.measure import Curve
from levanter_mars.training.run.metrics import read_metrics


@dataclass(frozen=True)
class RunResult:
    """What a run left: its eval curve and seconds per training token."""

    curve: Curve
    steps: int
    seconds_per_token: Optional[float]


def read_result(layout: Layout, rid: str, tokens_per_step: int, remote: bool) -> Optional[RunResult]:
    """A run's metrics, from its run directory, or from the copy beside its checkpoints (``remote``: runs on other
    machines, whose run directory is on their host 0)."""
    records = _metrics(layout.copied_metrics_url(rid)) if remote else read_metrics(layout.metrics_path(rid))
    if not records:
        return None
    evals = [(int(r["step"]) + 1, _finite(r["eval/loss"])) for r in records if "eval/loss" in r]
    steps = max(int(r["step"]) + 1 for r in records)
    durations = [float(r["throughput/duration"]) for r in records if "throughput/duration" in r]
    # The first steps compile and warm up; what is left is the run's steady pace.
    steady = durations[3:] if len(durations) > 6 else durations
    seconds_per_token = statistics.median(steady) / tokens_per_step if steady else None
    curve = Curve(tuple(float(s * tokens_per_step) for s, _ in evals), tuple(v for _, v in evals))
    return RunResult(curve, steps, seconds_per_token)


def _finite(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _metrics(url: str) -> list[dict[str, Any]]:
    try:
        with fsspec.open(url, "r") as f:
            lines = f.read().splitlines(True)
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.endswith("\n")]
