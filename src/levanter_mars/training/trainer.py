"""Levanter's Trainer, extended for MARS and for runs that must never lose work.

* Exact MARS: the optimizer receives a :class:`BatchObjective` of the current batch whose gradient is microbatched
  exactly like the main gradient (``per_device_parallelism``), so exact mode fits wherever approx mode fits.
* ``metrics.jsonl`` in every run directory, trimmed on resume so a resumed run's file reads as one run.
* Checkpoints carry a manifest; on resume, incomplete or corrupt checkpoints are reported, quarantined and the
  previous good one is used; a checkpoint from a different optimizer is refused with a clear message.
* Non-finite steps are skipped (and counted as ``optim/skipped_steps``) or stop the run, per ``trainer.nonfinite``;
  a non-finite state is never written to a checkpoint.
* The final checkpoint is written, and a run whose data runs out early says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax.quantization import partition_for_grad_overwrite
from levanter.callbacks import Callback, StepInfo
from levanter.checkpoint import Checkpointer, CheckpointerConfig, CheckpointInterval
from levanter.metrics import unwrap_metrics
from levanter.tracker import CompositeTracker, TrackerConfig
from levanter.tracker.wandb import WandbConfig
from levanter.trainer import InsideJitInfo, Trainer, TrainerConfig, TrainStepResult, _Hook
from levanter.trainer_state import trainables_only
from levanter.utils.tree_utils import inference_mode

from levanter_mars.optim.guard import NonFiniteGuardState, skip_nonfinite_updates
from levanter_mars.training import checkpoints as ckpt
from levanter_mars.training.metrics import METRICS_FILENAME, JsonlMetricsTracker
from levanter_mars.training.upstream import checkpointer_base_path, forward_force_to_checkpointer, stop_data_loader

logger = logging.getLogger(__name__)

NONFINITE_POLICIES = ("skip", "stop")


class NonFiniteTrainingError(RuntimeError):
    """Training stopped because of a NaN/Inf; the last checkpoint is finite."""


class DataExhaustedError(RuntimeError):
    """The training data ran out before ``num_train_steps``."""


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


class VerifiedCheckpointer(Checkpointer):
    """A Checkpointer that writes a manifest after each commit, refuses non-finite states, saves a step once, and
    surfaces asynchronous write failures (disk full, permissions) as a :class:`~checkpoints.CheckpointError`."""

    run_info: dict
    """Stored in every manifest (the trainer sets it) and compared on resume."""
    before_save: Optional[Callable[[], None]]
    """Called before a checkpoint is written: the trainer flushes the step's metrics, so that whatever a checkpoint
    contains is also in metrics.jsonl (a resumed run does not redo logged steps)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_info = {}
        self.before_save = None

    def on_step(self, info, force: bool = False):
        self.raise_if_failed()
        if force and (info.step == self._last_save_step or self._committed(info.step)):
            return  # already saved at this step: never rewrite a committed checkpoint in place
        super().on_step(info, force=force)

    def _committed(self, step: int) -> bool:
        status = ckpt.audit_checkpoint(f"{self.base_path.rstrip('/')}/step-{step}", verify_checksums=False)
        return status.usable and status.step == step

    def raise_if_failed(self) -> None:
        try:
            self._manager.check_for_errors()
        except Exception as e:  # noqa: BLE001
            raise ckpt.CheckpointError(
                f"writing a checkpoint under {self.base_path!r} failed ({type(e).__name__}: {e}). The previous "
                "checkpoint is intact; free disk space or fix permissions, then rerun the same command to resume."
            ) from e

    def save_checkpoint(self, info, destination: str, commit_callback=None, *, is_temporary: bool = False):
        if not bool(_all_finite(info.state.saveable_state)):
            raise NonFiniteTrainingError(
                f"refusing to checkpoint step {info.step}: the training state contains NaN/Inf"
            )
        path = f"{self.base_path.rstrip('/')}/{destination}"
        step = int(info.step)
        if self.before_save is not None:
            self.before_save()

        def commit():
            ckpt.write_manifest(path, step=step, run_info=self.run_info)
            if commit_callback is not None:
                commit_callback()  # deletes the previous temporary checkpoint: only after this one is complete

        try:
            super().save_checkpoint(info, destination, commit_callback=commit, is_temporary=is_temporary)
        except OSError as e:
            raise ckpt.CheckpointError(
                f"cannot write checkpoint {path} ({type(e).__name__}: {e}). The previous checkpoint is intact; free "
                "disk space or fix trainer.checkpointer.base_path, then rerun the same command to resume."
            ) from e


def _default_tracker() -> TrackerConfig:
    return WandbConfig(mode="offline")


@dataclass
class MarsTrainerConfig(TrainerConfig):
    """Levanter's TrainerConfig with safer defaults and the settings of :class:`MarsTrainer`."""

    nonfinite: str = "skip"
    """What a NaN/Inf in the loss, gradients, update or optimizer state does: 'skip' the update (counted as
    optim/skipped_steps) or 'stop' the run. Either way it never reaches the parameters or a checkpoint."""
    max_consecutive_nonfinite: int = 20
    """With nonfinite=skip, stop anyway after this many skipped steps in a row."""

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
        assert self.id is not None, "the run id is set by levanter.initialize"
        return Path(self.log_dir) / self.id


# One compiled program: dispatched op by op, the per-leaf reductions of a sharded state are dozens of small
# collective programs in flight at once, which deadlock XLA:CPU's multi-device rendezvous (seen with 8 simulated
# devices: "Expected 8 threads to join the rendezvous, but only 7 of them arrived", then abort).
@eqx.filter_jit
def _all_finite(tree: Any) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


class BatchObjective:
    """The loss of the current batch as a function of the trainable parameters, for optimizers that need it
    (exact MARS, Sophia). ``value_and_grad`` is microbatched exactly like the trainer's main gradient and uses the
    same RNG key, so the gradient at the previous parameters sees the same batch, dropout and microbatching."""

    def __init__(self, trainer: Trainer, state, batch, batch_kwargs, key):
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
        loss, grads, _ = self._trainer._compute_gradients_microbatched(
            self._trainer.loss_fn, self._model(trainable), *self._batch, **self._batch_kwargs, key=self._key
        )
        grads = trainables_only(grads, self._state.is_trainable)
        _, grads = partition_for_grad_overwrite(grads)
        return loss, grads


class NonFiniteMonitor(Callback):
    """Runs before the checkpointer: reports skipped steps and stops the run when the policy says so."""

    def __init__(self, policy: str, max_consecutive: int):
        self.policy = policy
        self.max_consecutive = max_consecutive
        self._seen = None

    def on_step(self, info, force: bool = False):
        guard = info.state.opt_state
        if not isinstance(guard, NonFiniteGuardState):
            return
        skipped, consecutive = int(guard.skipped_steps), int(guard.consecutive_skips)
        if self._seen is None:
            self._seen = skipped - (1 if consecutive else 0)
        if skipped <= self._seen:
            return
        self._seen = skipped
        message = (
            f"step {info.step}: NaN/Inf in the loss (= {info.loss}), gradients, update or optimizer state; the "
            f"update was skipped ({skipped} skipped so far, {consecutive} in a row)"
        )
        if self.policy == "stop":
            raise NonFiniteTrainingError(
                message + ". Stopping (trainer.nonfinite=stop). No checkpoint was written for this step; rerun the "
                "same command to resume from the last checkpoint, or set trainer.nonfinite=skip."
            )
        if consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                message + f". Stopping: trainer.max_consecutive_nonfinite={self.max_consecutive} reached."
            )
        logger.warning(message)


class MarsTrainer(Trainer):
    """See the module docstring. ``run_info`` (optimizer and model description) is stored in every checkpoint
    manifest and checked on resume."""

    config: MarsTrainerConfig

    def __init__(self, config: MarsTrainerConfig, optimizer, loss_fn, *, add_default_hooks=True, run_info=None):
        if not isinstance(config, MarsTrainerConfig):
            raise TypeError("MarsTrainer needs a MarsTrainerConfig (use levanter_mars' TrainLmConfig)")
        if config.nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"trainer.nonfinite must be one of {NONFINITE_POLICIES}, got {config.nonfinite!r}")
        self.run_info = run_info or {}
        self._resume_from: Optional[str] = None
        self._usable_checkpoints: Optional[list[ckpt.CheckpointStatus]] = None
        self._quarantined = 0
        self.checkpointer: Optional[Checkpointer] = None
        super().__init__(config, skip_nonfinite_updates(optimizer), loss_fn, add_default_hooks=add_default_hooks)
        self.metrics = JsonlMetricsTracker(config.run_dir / METRICS_FILENAME)
        self.tracker = CompositeTracker([self.tracker, self.metrics])

    # ----------------------------------------------------------------------------------------------- hooks
    def _add_default_hooks(self):
        ckpt.check_writable(self.config.checkpointer.expanded_path(self.run_id))
        # Before upstream creates its checkpointer, which reads the newest checkpoint's metadata and would crash on
        # a corrupt one.
        self._audit_checkpoints()
        super()._add_default_hooks()
        self.checkpointer = forward_force_to_checkpointer(self.hooks.hooks)
        if isinstance(self.checkpointer, VerifiedCheckpointer):
            self.checkpointer.run_info = self.run_info
            self.checkpointer.before_save = lambda: self.metrics.flush()
        monitor = NonFiniteMonitor(self.config.nonfinite, self.config.max_consecutive_nonfinite)
        self.hooks.hooks.insert(0, _Hook(monitor, every=1))

    # ---------------------------------------------------------------------------------------------- resume
    @property
    def checkpoint_path(self) -> str:
        return self._resume_from or super().checkpoint_path

    def _quarantine(self, path: str, reason: str) -> None:
        ckpt.quarantine(path, reason)
        self._quarantined += 1  # reported if no checkpoint is left

    def _run_checkpoint_dir(self) -> str:
        return self.config.load_checkpoint_path or self.config.checkpointer.expanded_path(self.run_id)

    def _audit_checkpoints(self) -> list[ckpt.CheckpointStatus]:
        """Usable checkpoints, newest first; incomplete and corrupt ones are reported and quarantined. Once."""
        if self._usable_checkpoints is None:
            verify = getattr(self.config.checkpointer, "verify_checksums", True)
            usable = []
            for status in ckpt.audit_run(self._run_checkpoint_dir(), verify_checksums=verify):
                if status.usable:
                    usable.append(status)
                else:
                    logger.warning("Skipping %s checkpoint %s: %s", status.state, status.path, status.reason)
                    self._quarantine(status.path, f"{status.state}: {status.reason}")
            self._usable_checkpoints = usable
        return self._usable_checkpoints

    def initial_state(self, training_key, model=None, model_init=None, *, is_trainable=True):
        if self.config.load_checkpoint is False:
            return super().initial_state(training_key, model, model_init, is_trainable=is_trainable)
        candidates = self._audit_checkpoints()
        for status in candidates:
            ckpt.check_compatible(status, self.run_info)
            self._resume_from = status.path
            try:
                state = super().initial_state(training_key, model, model_init, is_trainable=is_trainable)
            except Exception as e:  # noqa: BLE001 - any failure to load means try the previous checkpoint
                if status.state == "verified":
                    raise ckpt.CheckpointError(
                        f"checkpoint {status.path} is intact (its manifest verifies) but does not load into this "
                        f"run's state ({type(e).__name__}: {e}). Was the model or optimizer config changed?"
                    ) from e
                logger.warning("Checkpoint %s does not load (%s: %s); trying the previous one", status.path,
                               type(e).__name__, e)
                self._quarantine(status.path, f"failed to load: {type(e).__name__}: {e}")
                continue
            if not bool(_all_finite(state.saveable_state)):
                logger.warning("Checkpoint %s holds NaN/Inf; trying the previous one", status.path)
                self._quarantine(status.path, "state contains NaN/Inf")
                continue
            logger.info("Resuming from %s (step %s, %s)", status.path, int(state.step), status.state)
            # A checkpoint of state.step = S holds S updates; the log already has steps 0 .. S-1.
            self.metrics.truncate_after(int(state.step) - 1)
            return state
        self._resume_from = None
        if self._quarantined:  # every checkpoint was bad: say so, not only "No checkpoint found"
            logger.error(
                "No usable checkpoint left in %s (%d quarantined in %s.quarantine): starting from scratch",
                self._run_checkpoint_dir(), self._quarantined, self._run_checkpoint_dir().rstrip("/"),
            )
        if self.config.load_checkpoint is True:
            raise ckpt.CheckpointError(
                f"trainer.load_checkpoint is true but no usable checkpoint exists in {self._run_checkpoint_dir()}"
            )
        state = super().initial_state(training_key, model, model_init, is_trainable=is_trainable)
        self.metrics.truncate_after(int(state.step) - 1)
        return state

    # -------------------------------------------------------------------------------------------- training
    _already_complete = False

    def run_hooks(self, info, force: bool = False):
        if not self._already_complete:  # a finished run resumed: evaluations and checkpoints are already done
            super().run_hooks(info, force=force)

    def train(self, state, train_loader):
        if int(state.step) >= self.num_train_steps:
            logger.warning(
                "Run %s is already complete (%d of %d steps); nothing to do. Set fresh=true to start over.",
                self.run_id, int(state.step), self.num_train_steps,
            )
            self._already_complete = True
            stop_data_loader(train_loader)
            return StepInfo(state, float("nan"), 0.0)
        self._checkpoint_after_other_hooks()
        try:
            info = super().train(state, train_loader)
        finally:
            # Never leave a checkpoint half-written behind an exception, keep what was logged, and stop prefetching.
            if self.checkpointer is not None:
                self.checkpointer.wait_until_finished()
            self.metrics.flush()
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

    def _checkpoint_after_other_hooks(self) -> None:
        """Evaluation hooks are added after the trainer is built; run them before the checkpointer, so a step's
        metrics (eval loss included) are all logged, and flushed, before its checkpoint is written."""
        is_checkpointer = [getattr(h.fn, "fn", None) == getattr(self.checkpointer, "on_step", 0) for h in self.hooks.hooks]
        ordered = [h for h, c in zip(self.hooks.hooks, is_checkpointer) if not c]
        ordered += [h for h, c in zip(self.hooks.hooks, is_checkpointer) if c]
        self.hooks.hooks[:] = ordered

    def _train_step(self, state, batch, batch_kwargs, _no_hooks=False) -> TrainStepResult:
        # Upstream's Trainer._train_step, except for the objective handed to the optimizer (upstream defect 2).
        key, new_key = jax.random.split(state.training_key)
        model = inference_mode(state.model, False)

        loss, grads, wrapped_metrics = self._compute_gradients_microbatched(
            self.loss_fn, model, *batch, **batch_kwargs, key=key
        )
        objective = BatchObjective(self, state, batch, batch_kwargs, key)
        new_state, updates = state.take_step(grads, obj_fun=objective, loss=loss, key=new_key)
        new_state = hax.shard(new_state, self.parameter_axis_mapping)

        hook_infos = None
        if not _no_hooks:
            with hax.axis_mapping(self.parameter_axis_mapping):
                jit_info: InsideJitInfo = InsideJitInfo(grads=grads, updates=updates)
                hook_infos = self.hooks.run_jit_hooks(state, jit_info, force=False)

        plain_metrics = unwrap_metrics(wrapped_metrics)
        train_metrics = {f"train/{k}": v for k, v in plain_metrics.items()}
        result = TrainStepResult(loss=loss, new_state=new_state, loss_metrics=train_metrics, hook_infos=hook_infos)
        return hax.shard_with_axis_mapping(result, self.parameter_axis_mapping)


__all__ = [
    "BatchObjective",
    "DataExhaustedError",
    "MarsTrainer",
    "MarsTrainerConfig",
    "NonFiniteMonitor",
    "NonFiniteTrainingError",
    "VerifiedCheckpointer",
    "VerifiedCheckpointerConfig",
]

