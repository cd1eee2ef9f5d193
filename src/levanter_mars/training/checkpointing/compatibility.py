"""Whether this run can load a checkpoint's optimizer state: the layout fields it was written with must match."""

from __future__ import annotations

from levanter_mars.training.checkpointing.audit import CheckpointStatus
from levanter_mars.training.errors import CheckpointMismatchError
from levanter_mars.training.run.identity import LAYOUT_OPTIONS_ADDED, OPTIMIZER_LAYOUT_FIELDS


def check_compatible(status: CheckpointStatus, current_run_info: dict) -> None:
    """Raises :class:`CheckpointMismatchError` (a config error, naming the field) if the checkpoint's optimizer state
    cannot be loaded by this run."""
    saved = (status.run_info or {}).get("optimizer") or {}
    current = current_run_info.get("optimizer") or {}
    saved = {**LAYOUT_OPTIONS_ADDED, **saved}  # a checkpoint written before an option had that option's earlier value
    for key in OPTIMIZER_LAYOUT_FIELDS:
        if key in saved and key in current and saved[key] != current[key]:
            raise CheckpointMismatchError(
                f"checkpoint {status.path} was written with optimizer.{key}={saved[key]!r}, but this run has "
                f"optimizer.{key}={current[key]!r}; its optimizer state cannot be resumed. Resume with the "
                f"original optimizer, or start a new run (a different trainer.id, or fresh=true to set the old "
                f"run aside)."
            )
