"""Levanter's checkpointer, made safe to lose a run to: manifests, no non-finite states, no silent write failures."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import equinox as eqx
from levanter.checkpoint import Checkpointer, CheckpointerConfig, CheckpointInterval

from levanter_mars.compat.levanter_training import (
    RemovesItsMarkersFirst,
    checkpointer_base_path,
    last_saved_step,
    raise_pending_write_error,
)
from levanter_mars.compat.tensorstore_writes import writes_keep_no_chunk_cache
from levanter_mars.optim.guard import all_finite
from levanter_mars.training.checkpointing import manifest
from levanter_mars.training.checkpointing.quarantine import clear_quarantine_marker
from levanter_mars.training.checkpointing.storage import MANIFEST_NAME, METADATA_NAME
from levanter_mars.training.errors import CheckpointError, NonFiniteTrainingError
from levanter_mars.training.run.goodput import clock as goodput_clock


@dataclass
class VerifiedCheckpointerConfig(CheckpointerConfig):
    """Levanter's checkpointer config, creating a :class:`VerifiedCheckpointer`."""

    verify_checksums: bool = True
    """Check every file's CRC32C on resume (local files are read; on GCS the object metadata is used)."""

    def create(self, run_id) -> "VerifiedCheckpointer":
        return VerifiedCheckpointer(
            base_path=checkpointer_base_path(self.expanded_path(run_id)),
            save_interval=self.save_interval,
            step_policies=[CheckpointInterval(**k) for k in self.keep],
            delete_old_temp_checkpoints=self.delete_old_temp_checkpoints,
        )


class VerifiedCheckpointer(RemovesItsMarkersFirst, Checkpointer):
    """A Checkpointer that writes a manifest after each commit (process 0, after every host's writes), refuses
    non-finite states, saves a step once, surfaces asynchronous write failures (disk full, permissions) as a
    :class:`~levanter_mars.training.errors.CheckpointError`, and deletes a superseded checkpoint's metadata and
    manifest before its arrays (a delete cut short leaves it incomplete, quarantined on resume)."""

    deleted_first = (METADATA_NAME, MANIFEST_NAME)

    run_info: dict
    """Stored in every manifest (the trainer sets it) and compared on resume."""
    before_save: Optional[Callable[[int], None]]
    """Called with the step before its checkpoint is written: the trainer flushes the step's metrics, so that whatever
    a checkpoint contains is also in metrics.jsonl (a resumed run does not redo logged steps), and marks the goodput
    record."""
    resumed_step: Optional[int]
    """The step of the checkpoint the run resumed from: already on disk, never rewritten in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_info = {}
        self.before_save = None
        self.resumed_step = None
        self._deferred: Optional[list] = None
        self._pending: list = []

    def on_step(self, info, force: bool = False):
        if self._deferred is not None:
            self._deferred.append((info, force))
            return
        self.raise_if_failed()
        # Decided from what every host knows alike (never from a listing that one host may see before another).
        if force and int(info.step) in (last_saved_step(self), self.resumed_step):
            return
        with goodput_clock.phase("checkpoint"):
            super().on_step(info, force=force)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Saves requested meanwhile wait for :meth:`save_deferred`. Levanter logs a step's training metrics (its
        loss) after that step's hooks and more after the step; a checkpoint saved from the hook could be on disk
        before its step's metrics are in metrics.jsonl, and a kill then would lose them for good (the resumed run
        does not redo the step). The trainer saves at the start of the next step instead."""
        self._deferred = []
        try:
            yield
        finally:
            self._pending, self._deferred = self._deferred, None

    def save_deferred(self) -> None:
        pending, self._pending = self._pending, []
        for info, force in pending:
            if int(info.step) != last_saved_step(self):  # the final forced save may have written it already
                self.on_step(info, force=force)

    def raise_if_failed(self) -> None:
        try:
            raise_pending_write_error(self)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(
                f"writing a checkpoint under {self.base_path!r} failed ({type(e).__name__}: {e}). The previous "
                "checkpoint is intact; free disk space or fix permissions, then rerun the same command to resume."
            ) from e

    def save_checkpoint(self, info, destination: str, commit_callback=None, *, is_temporary: bool = False):
        if not bool(state_is_finite(info.state.saveable_state)):
            raise NonFiniteTrainingError(
                f"refusing to checkpoint step {info.step}: the training state contains NaN/Inf"
            )
        path = f"{self.base_path.rstrip('/')}/{destination}"
        step = int(info.step)
        if self.before_save is not None:
            try:
                self.before_save(int(info.state.step))
            except OSError as e:  # the run's own files beside the checkpoint (metrics, goodput): the storage's trouble
                raise CheckpointError(f"before checkpoint {path}: {type(e).__name__}: {e}") from e

        def commit():  # process 0 only, once every host's writes are done
            clear_quarantine_marker(path)  # this step was quarantined in place before: now saved anew
            manifest.write_manifest(path, step=step, run_info=self.run_info)
            if commit_callback is not None:
                commit_callback()  # deletes the previous temporary checkpoint: only after this one is complete

        try:
            with writes_keep_no_chunk_cache():  # else each save's chunks stay in host memory (defect 50)
                super().save_checkpoint(info, destination, commit_callback=commit, is_temporary=is_temporary)
        except OSError as e:
            raise CheckpointError(
                f"cannot write checkpoint {path} ({type(e).__name__}: {e}). The previous checkpoint is intact; free "
                "disk space or fix trainer.checkpointer.base_path, then rerun the same command to resume."
            ) from e


# One compiled program: dispatched op by op, the per-leaf reductions of a sharded state are dozens of small
# collective programs in flight at once, which deadlock XLA:CPU's multi-device rendezvous (seen with 8 simulated
# devices: "Expected 8 threads to join the rendezvous, but only 7 of them arrived", then abort).
state_is_finite = eqx.filter_jit(all_finite)
