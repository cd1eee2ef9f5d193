"""Where a comparison's files go.

A run is ``python -m levanter_mars.main.train_lm`` on ``<output_dir>/configs/<run id>.yaml`` (plus the comparison's
overrides); its metrics land in ``<output_dir>/runs/<run id>/`` and its checkpoints under the checkpoint base path
(``<output_dir>/checkpoints`` unless the base config's is a bucket). When it ends, the comparison writes
``<output_dir>/records/<run id>.json`` (``compare/records.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from levanter_mars.compare.spec import CompareConfig
from levanter_mars.training.run.metrics import METRICS_FILENAME
from levanter_mars.training.run.record_copy import record_url


@dataclass(frozen=True)
class Layout:
    """Where a comparison's files go."""

    output_dir: str
    checkpoint_base: str

    @classmethod
    def of(cls, spec: CompareConfig, base: Mapping[str, Any]) -> "Layout":
        base_path = str(base.get("trainer", {}).get("checkpointer", {}).get("base_path", ""))
        remote = "://" in base_path
        return cls(spec.output_dir, base_path if remote else os.path.join(spec.output_dir, "checkpoints"))

    def path(self, *parts: str) -> str:
        return os.path.join(self.output_dir, *parts)

    def config_path(self, rid: str) -> str:
        return self.path("configs", f"{rid}.yaml")

    def record_path(self, rid: str) -> str:
        return self.path("records", f"{rid}.json")

    def log_path(self, rid: str) -> str:
        return self.path("logs", f"{rid}.log")

    def metrics_path(self, rid: str) -> str:
        return self.path("runs", rid, METRICS_FILENAME)

    def copied_metrics_url(self, rid: str) -> str:
        """Where the run's metrics are copied beside its checkpoints when it ends (``training/run/record_copy``)."""
        return record_url(f"{self.checkpoint_base.rstrip('/')}/{rid}", METRICS_FILENAME)
