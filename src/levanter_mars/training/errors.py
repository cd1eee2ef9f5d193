"""Why a run stops: each error is raised on every process alike, and the entry point maps it to an exit code."""

from __future__ import annotations

from levanter_mars.training.distributed import shared_error


@shared_error
class NonFiniteTrainingError(RuntimeError):
    """Training stopped because of a NaN/Inf; the last checkpoint is finite."""


@shared_error
class DataExhaustedError(RuntimeError):
    """The training data ran out before ``num_train_steps``."""


@shared_error
class CheckpointError(RuntimeError):
    """A checkpoint cannot be used or written; the message names it and says why."""
