"""Levanter's Trainer, extended for MARS and for runs that must never lose work.

* Exact MARS: the optimizer receives a :class:`BatchObjective` of the current batch whose gradient is microbatched
  exactly like the main gradient (``per_device_parallelism``), so exact mode fits wherever approx mode fits.
* ``metrics.jsonl`` in the run directory, written by process 0 only and trimmed on resume so that a resumed run's
  file reads as one run.
* Resume follows the :class:`~levanter_mars.training.checkpointing.resume.ResumePlan` process 0 made: every host loads the same
  checkpoint, or all move on to the previous one together. A checkpoint in an earlier main's optimizer-state layout is
  migrated as it loads (:mod:`~levanter_mars.training.checkpointing.migrations`).
* A step whose gradients are not finite is skipped (counted as ``optim/skipped_steps``) or stops the run, per
  ``trainer.nonfinite``; a value that would be written NaN/Inf from finite inputs (optimizer state, or a parameter
  after its update) keeps its previous value and is counted (``optim/nonfinite_outputs``); a non-finite state is
  never written to a checkpoint.
* The final checkpoint is written, and a run whose data runs out early says so.
* A preemption notice (SIGTERM to any host) saves the step every host is at, and the run stops with exit 9
  (:mod:`..preemption`); a resize request stops it after its next checkpoint (:mod:`..resize_stop` holds both).
* Where the time goes: training, checkpointing and (the evaluation hooks mark their own) evaluation count to their
  phases of the process's goodput clock; process 0 keeps the run's goodput record (:mod:`..run.goodput`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Optional, Tuple

import equinox as eqx
from haliax.quantization import partition_for_grad_overwrite
from levanter.callbacks import Callback, StepInfo
from levanter.tracker import CompositeTracker, TrackerConfig
from levanter.tracker.wandb import WandbConfig
from levanter.trainer import TrainerConfig
from levanter.trainer_state import trainables_only
from levanter.utils.tree_utils import inference_mode
from jax.sharding import Mesh

from levanter_mars.compat import levanter_slices
from levanter_mars.compat.levanter_training import FixedTrainer, stop_data_loader, strongly_typed_step
from levanter_mars.optim.guard import skip_nonfinite_updates
from levanter_mars.training import distributed
from levanter_mars.training.checkpointing.writer import VerifiedCheckpointer, VerifiedCheckpointerConfig
from levanter_mars.training.checkpointing.storage import check_writable
from levanter_mars.training.run.lease import RunLease
from levanter_mars.training.errors import CheckpointError, DataExhaustedError, Preempted
from levanter_mars.training.preemption import DEFAULT_GRACE_S, PreemptionNotice
from levanter_mars.training.resize_stop import StopAtCheckpoint
from levanter_mars.training.run.goodput import clock as goodput_clock
from levanter_mars.training.run.goodput import GoodputRecord
from levanter_mars.training.run.metrics import METRICS_FILENAME, JsonlMetricsTracker
from levanter_mars.training.nonfinite import NONFINITE_POLICIES, NonFiniteMonitor
from levanter_mars.training.checkpointing.migrations import load_trainer_state
from levanter_mars.training.checkpointing.resume import ResumePlan, load_first_usable

logger = logging.getLogger(__name__)


def _default_tracker() -> TrackerConfig:
    return WandbConfig(mode="offline")


@dataclass
class MarsTrainerConfig(TrainerConfig):
    """Levanter's TrainerConfig with safer defaults and the settings of :class:`MarsTrainer`."""

    compilation_cache: Optional[str] = None
    """Where compiled programs are kept for retries and resumes: a directory or URL, or 'none'. Unset:
    $JAX_COMPILATION_CACHE_DIR if set, else <checkpointer.base_path>/compile-cache (training/compilation_cache.py)."""
    nonfinite: str = "skip"
    """What a NaN/Inf in the step's gradients (exact mode: also its second gradient) does: 'skip' the update (counted
    as optim/skipped_steps) or 'stop' the run. Either way it never reaches the parameters or a checkpoint."""
    max_consecutive_nonfinite: int = 20
    """With nonfinite=skip, stop anyway after this many skipped steps in a row."""
    preemption_grace_s: float = DEFAULT_GRACE_S
    """After a preemption notice (SIGTERM to any host), how long the save of the step every host stops at may take;
    past it the run stops anyway (exit 9) and the previous checkpoint is the resume point (training/preemption.py)."""

    tracker: TrackerConfig | Tuple[TrackerConfig, ...] = field(default_factory=_default_tracker)
    checkpointer: VerifiedCheckpointerConfig = field(default_factory=VerifiedCheckpointerConfig)
    # The guard above handles NaN/Inf (Levanter's own check would crash before it can skip).
    crash_on_nan: bool = False
    crash_on_inf: bool = False
    require_accelerator: Optional[bool] = False
    log_jaxprs: bool = False
    log_xla_hlo: bool = False

    @property
    def run_dir(self) -> Path:
        assert self.id is not None, "the run id is set before the trainer is built"
        return Path(self.log_dir) / self.id

    @cached_property
    def num_slices(self) -> int:
        """The launcher's slices (``MEGASCALE_NUM_SLICES``), also where devices carry no slice index (compat 42)."""
        return levanter_slices.slices_of_job(lambda: TrainerConfig.num_slices.func(self))

    @property
    def device_mesh(self) -> Mesh:
        """Levanter's (replica, data, model) mesh, its DCN axes across the slices of processes (compat 42)."""
        return levanter_slices.create_fsdp_mesh(self.replica_ici_axis_size, self.data_ici_axis_size,
                                                self.model_axis_size, self.replica_dcn_axis_size,
                                                self.data_dcn_axis_size)  # fmt: skip


class BatchObjective:
    """The loss of the current batch as a function of the trainable parameters, for optimizers that need it
    (exact MARS, Sophia). ``value_and_grad`` is microbatched exactly like the trainer's main gradient and uses the
    same RNG key, so the gradient at the previous parameters sees the same batch, dropout and microbatching."""

    def __init__(self, trainer: "MarsTrainer", state, batch, batch_kwargs, key):
        self._trainer = trainer
        self._state = state
        self._batch = batch
        self._batch_kwargs = batch_kwargs
        self._key = key

    def _model(self, trainable):
        return inference_mode(eqx.combine(trainable, self._state.model), False)

    def __call__(self, trainable):
        loss, _metrics = self._trainer.loss_fn(self._model(trainable), *self._batch, **self._batch_kwargs, key=self._key)
        return loss

    def value_and_grad(self, trainable):
        loss, grads, _ = self._trainer.microbatched_value_and_grad(
            self._model(trainable), self._batch, self._batch_kwargs, self._key
        )
        grads = trainables_only(grads, self._state.is_trainable)
        _, grads = partition_for_grad_overwrite(grads)
        return loss, grads


class MarsTrainer(FixedTrainer):
    """See the module docstring. ``run_info`` (optimizer and model description) is stored in every checkpoint
    manifest and checked on resume; ``resume`` is process 0's decision of what to resume from; ``goodput`` is the
    run's goodput record and ``lease`` the run's lease (process 0): checked every step, verified before each
    checkpoint; ``resize_request``: the launch's, if it may ask the run to stop at a checkpoint (``run/resize.py``)."""

    config: MarsTrainerConfig

    def __init__(self, config, optimizer, loss_fn, *, run_info: dict, resume: Optional[ResumePlan],
                 goodput: Optional[GoodputRecord] = None, lease: Optional[RunLease] = None,
                 resize_request: Optional[tuple[str, str]] = None):  # fmt: skip
        if not isinstance(config, MarsTrainerConfig):
            raise TypeError("MarsTrainer needs a MarsTrainerConfig (use levanter_mars' TrainLmConfig)")
        if config.nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"trainer.nonfinite must be one of {NONFINITE_POLICIES}, got {config.nonfinite!r}")
        self.run_info = run_info
        self.resume_plan = resume
        self.goodput = goodput
        self.lease = lease
        self.preemption = PreemptionNotice(config.preemption_grace_s)
        self.stops = StopAtCheckpoint(resize_request, self.preemption)
        self._resume_from: Optional[str] = None
        super().__init__(config, skip_nonfinite_updates(optimizer), loss_fn)
        # One writer: on a pod only process 0 keeps metrics.jsonl (hosts may share the log directory).
        self.metrics = JsonlMetricsTracker(config.run_dir / METRICS_FILENAME) if distributed.is_leader() else None
        if self.metrics is not None:
            self.tracker = CompositeTracker([self.tracker, self.metrics])

    def flush_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.flush()

    def before_checkpoint(self, step: int) -> None:
        # Every host saves: all stop together if another launch took the run over.
        distributed.leader_decides(lambda: self.lease.verify() if self.lease is not None else None)
        self.stops.look(self.config.num_slices)
        self.flush_metrics()
        if self.goodput is not None:
            self.goodput.checkpoint_saving(step)

    # ----------------------------------------------------------------------------------------------- hooks
    def before_default_hooks(self) -> None:
        directory = self.config.checkpointer.expanded_path(self.run_id)
        distributed.leader_decides(lambda: check_writable(directory))

    def after_default_hooks(self) -> None:
        if isinstance(self.checkpointer, VerifiedCheckpointer):
            self.checkpointer.run_info = self.run_info
            self.checkpointer.before_save = self.before_checkpoint
        self.add_first_hook(NonFiniteMonitor(self.config.nonfinite, self.config.max_consecutive_nonfinite))
        if self.goodput is not None:
            self.add_first_hook(_StepRecorder(self.goodput))
        if self.lease is not None:
            self.add_first_hook(_LeaseCheck(self.lease))

    # ---------------------------------------------------------------------------------------------- resume
    @property
    def checkpoint_path(self) -> str:
        return self._resume_from or super().checkpoint_path

    def initial_state(self, training_key, model=None, model_init=None, *, is_trainable=True):
        def fresh():
            return super(MarsTrainer, self).initial_state(training_key, model, model_init, is_trainable=is_trainable)

        def fresh_with(optimizer):
            # Levanter builds the state it loads into from self.optimizer: a stored layout's, for the time of a load.
            current, self.optimizer = self.optimizer, optimizer
            try:
                return fresh()
            finally:
                self.optimizer = current

        def load(path: str):
            self._resume_from = path
            return load_trainer_state(path, self.optimizer, fresh_with)

        state = None
        if self.config.load_checkpoint is not False and self.resume_plan is not None:
            state = load_first_usable(self.resume_plan, load)
        if state is None:
            self._resume_from = None
            if self.config.load_checkpoint is True:
                raise CheckpointError(
                    f"trainer.load_checkpoint is true but no usable checkpoint exists in "
                    f"{self.resume_plan.checkpoint_dir if self.resume_plan else self.checkpoint_path}"
                )
            state = strongly_typed_step(fresh())
        elif isinstance(self.checkpointer, VerifiedCheckpointer):
            self.checkpointer.resumed_step = int(state.step)
        if self.goodput is not None and int(state.step) < self.num_train_steps:  # a complete run is no attempt
            self.goodput.begin(int(state.step))
        if self.metrics is not None:
            # A checkpoint of state.step = S holds S updates; the log already has steps 0 .. S-1.
            self.metrics.truncate_after(int(state.step) - 1)
        return state

    # -------------------------------------------------------------------------------------------- training
    _already_complete = False

    def run_hooks(self, info, force: bool = False):
        if not self._already_complete:  # a finished run resumed: evaluations and checkpoints are already done
            super().run_hooks(info, force=force)

    def train(self, state, train_loader):
        if int(state.step) >= self.num_train_steps:  # every host loaded the same step: the same answer everywhere
            logger.warning(
                "Run %s is already complete (%d of %d steps); nothing to do. Set fresh=true to start over.",
                self.run_id, int(state.step), self.num_train_steps,
            )
            self._already_complete = True
            stop_data_loader(train_loader)
            return StepInfo(state, float("nan"), 0.0)
        # Evaluation hooks run before the checkpointer, so a step's metrics (eval loss included) are all logged,
        # and flushed, before its checkpoint is written.
        checkpointer_step = getattr(self.checkpointer, "on_step", None)
        self.order_hooks(lambda fn: checkpointer_step is not None and getattr(fn, "fn", None) == checkpointer_step)
        left_now = False
        try:
            with goodput_clock.phase("train"), self.preemption.listening():
                info = super().train(state, train_loader)
                if isinstance(self.checkpointer, VerifiedCheckpointer):
                    self.checkpointer.save_deferred()
        except Preempted as e:
            left_now = getattr(e, "leave_now", False)
            raise
        finally:
            # Never leave a checkpoint half-written behind an exception (but a preemption's grace is over: its write
            # is left torn), keep what was logged, and stop prefetching.
            if self.checkpointer is not None and not left_now:
                with goodput_clock.phase("checkpoint"):
                    self.checkpointer.wait_until_finished()
            self.flush_metrics()
            stop_data_loader(train_loader)
        if self.checkpointer is not None:
            self.checkpointer.raise_if_failed()
        completed = int(info.state.step)
        if completed < self.num_train_steps:
            raise DataExhaustedError(
                f"the training data ran out after {completed} of trainer.num_train_steps="
                f"{self.num_train_steps} (a checkpoint was saved). Add data, raise `epoch`, or lower num_train_steps."
            )
        return info

    def train_step(self, state, *batch, **batch_kwargs):
        if not isinstance(self.checkpointer, VerifiedCheckpointer):
            return super().train_step(state, *batch, **batch_kwargs)
        # A step's checkpoint is written at the start of the next step, once all of its metrics are logged
        # (see VerifiedCheckpointer.deferring); the last step's, by the final forced hooks or at the end of train.
        self.checkpointer.save_deferred()
        self.stops.stop_if_asked(self.checkpointer, state)
        with self.checkpointer.deferring():
            return super().train_step(state, *batch, **batch_kwargs)

    def objective(self, state, batch, batch_kwargs, key) -> BatchObjective:
        return BatchObjective(self, state, batch, batch_kwargs, key)


class _StepRecorder(Callback):
    """Tells the goodput record each step that is done (it snapshots itself every few seconds)."""

    def __init__(self, record: GoodputRecord):
        self.record = record

    def on_step(self, info, force: bool = False):
        self.record.step_done(info.step)


class _LeaseCheck(Callback):
    """Stops the run at the first step after its lease was found taken over (process 0; its peers follow it)."""

    def __init__(self, lease: RunLease):
        self.lease = lease

    def on_step(self, info, force: bool = False):
        self.lease.check()
