"""Levanter's Trainer and Checkpointer, where they need fixing or reaching into (defects 1, 2, 10, 15, 36, 40, 41).

:class:`FixedTrainer` is Levanter's ``Trainer`` with defects 1 and 2 fixed; the project's trainer subclasses it and
never names a private member of Levanter itself.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from typing import Any, Callable, Optional

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from levanter.callbacks import Callback, LambdaCallback
from levanter.checkpoint import Checkpointer
from levanter.metrics import unwrap_metrics
from levanter.trainer import InsideJitInfo, Trainer, TrainStepResult, _Hook
from levanter.utils.tree_utils import inference_mode


class _ForceForwardingCallback(Callback):
    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def on_step(self, info, force: bool = False):
        self.fn(info, force=force)


def forward_force_to_checkpointer(hooks: list) -> Checkpointer | None:
    """Defect 1. Rewraps the trainer's checkpointer hook so that ``run_hooks(force=True)`` reaches it.

    Returns the checkpointer (or None if the trainer has none).
    """
    found = None
    for hook in hooks:
        fn = hook.fn
        if isinstance(fn, LambdaCallback) and isinstance(getattr(fn.fn, "__self__", None), Checkpointer):
            found = fn.fn.__self__
            hook.fn = _ForceForwardingCallback(fn.fn)
    return found


def stop_data_loader(iterator: Any) -> None:
    """Defect 10. Stops a ``DataLoaderIterator``'s background prefetching (what its ``__del__`` does)."""
    background = getattr(iterator, "_batches", None)
    if background is not None and hasattr(background, "stop"):
        background.stop()


def checkpointer_base_path(path: str) -> str:
    """A local checkpoint base path made absolute (defect 15): joining it with itself is then a no-op."""
    return path if "://" in path else os.path.abspath(path)


class RemovesItsMarkersFirst(Checkpointer):
    """Defect 40. Levanter deletes a superseded temporary checkpoint with one recursive delete, in whatever order the
    storage lists its files: cut short (kill -9, preemption), it can leave ``metadata.json`` beside part of the
    arrays, which looks like a checkpoint written whole, while zarr reads the deleted chunks as zeros. Here the files
    named by :attr:`deleted_first` go first, so that a delete cut short leaves a checkpoint that is plainly
    incomplete."""

    deleted_first: tuple[str, ...] = ()

    def _do_rm_checkpoint(self, checkpoint):
        import contextlib
        import posixpath

        from levanter.checkpoint import _get_fs_and_plain_path
        from levanter.utils import fsspec_utils

        fs, plain_path = _get_fs_and_plain_path(self.base_path)
        path = fsspec_utils.join_path(plain_path, checkpoint)
        for name in self.deleted_first:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(posixpath.join(path, name))
        super()._do_rm_checkpoint(checkpoint)


def raise_pending_write_error(checkpointer: Checkpointer) -> None:
    """Re-raises an asynchronous checkpoint write failure; Levanter keeps it in its private manager."""
    checkpointer._manager.check_for_errors()


def last_saved_step(checkpointer: Checkpointer) -> Optional[int]:
    return checkpointer._last_save_step


#: sha256 of ``inspect.getsource(levanter.trainer.Trainer._train_step)`` in Levanter 1.2.dev1644, the method that
#: :meth:`FixedTrainer._train_step` copies. Any upstream change to it (a fix, a new metric) would otherwise be dropped
#: silently by the copy.
COPIED_TRAIN_STEP_SHA256 = "e8c545ce3142e6a8b5d4da8cdc1b850f5072ddccd39375781e14d88571f57516"


def check_copied_train_step_is_current() -> None:
    """Raises if Levanter's ``Trainer._train_step`` is no longer the one :meth:`FixedTrainer._train_step` copies."""
    digest = hashlib.sha256(inspect.getsource(Trainer._train_step).encode()).hexdigest()
    if digest != COPIED_TRAIN_STEP_SHA256:
        raise RuntimeError(
            f"levanter.trainer.Trainer._train_step changed (source sha256 {digest}, copied from "
            f"{COPIED_TRAIN_STEP_SHA256}): port the change into levanter_mars.compat.levanter_training."
            "FixedTrainer._train_step, then update COPIED_TRAIN_STEP_SHA256"
        )


class FixedTrainer(Trainer):
    """Levanter's ``Trainer`` with defects 1 and 2 fixed.

    Subclasses provide :meth:`objective` (what the optimizer receives as ``obj_fun``) and may extend
    :meth:`after_default_hooks`; the checkpointer found among the default hooks is ``self.checkpointer``.
    Constructing one fails if upstream's ``_train_step`` is not the version copied here.
    """

    checkpointer: Optional[Checkpointer] = None

    def __init__(self, *args, **kwargs):
        check_copied_train_step_is_current()
        super().__init__(*args, **kwargs)

    def _add_default_hooks(self):
        self.before_default_hooks()
        super()._add_default_hooks()
        self.checkpointer = forward_force_to_checkpointer(self.hooks.hooks)
        self.after_default_hooks()

    def before_default_hooks(self) -> None:
        """Runs before Levanter creates its checkpointer (which reads the newest checkpoint's metadata)."""

    def after_default_hooks(self) -> None:
        """Runs once the default hooks, the checkpointer among them, exist."""

    def add_first_hook(self, callback: Callback) -> None:
        """A hook that runs every step, before every other hook."""
        self.hooks.hooks.insert(0, _Hook(callback, every=1))

    def order_hooks(self, is_last: Callable[[Any], bool]) -> None:
        """Moves the hooks whose callback satisfies ``is_last`` to the end, keeping the order otherwise."""
        hooks = self.hooks.hooks
        hooks[:] = [h for h in hooks if not is_last(h.fn)] + [h for h in hooks if is_last(h.fn)]

    def microbatched_value_and_grad(self, model, batch, batch_kwargs, key):
        """Loss, gradients and metrics, microbatched like the main gradient (``per_device_parallelism``)."""
        return self._compute_gradients_microbatched(self.loss_fn, model, *batch, **batch_kwargs, key=key)

    def objective(self, state, batch, batch_kwargs, key):
        raise NotImplementedError

    def _train_step(self, state, batch, batch_kwargs, _no_hooks=False) -> TrainStepResult:
        # Upstream's Trainer._train_step (COPIED_TRAIN_STEP_SHA256), except for the objective handed to the optimizer
        # (defect 2).
        key, new_key = jax.random.split(state.training_key)
        model = inference_mode(state.model, False)

        loss, grads, wrapped_metrics = self.microbatched_value_and_grad(model, batch, batch_kwargs, key)
        objective = self.objective(state, batch, batch_kwargs, key)
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


def eval_loss_running_state(Tag: hax.Axis):
    """Defect 32. The eval loss's running state (``levanter.eval._EvalRunningMeans``, zeros, replicated) as
    ``TaggedEvaluator.evaluate`` starts it: its jitted step takes it, and Levanter keeps the class private."""
    from levanter.eval import _EvalRunningMeans

    return hax.shard(_EvalRunningMeans.zeros_like(jnp.zeros(()), hax.zeros(Tag, dtype=jnp.float32)))


def jitted_train_step(trainer: Trainer):
    """Defect 32. The trainer's jitted step (``named_jit`` of ``_train_step``, state donated): Levanter offers no
    public handle on it, and pre-flight must lower exactly that program for a TPU topology."""
    return trainer._jit_train_step_fn


def strongly_typed_step(state):
    """Defect 41. A fresh ``TrainerState``'s step is a weakly typed int32 (its converter makes ``0`` an array, and
    ``step + 1`` keeps the weak type), a loaded one is strongly typed: the jit hooks' ``step % every`` then traces to
    another program, so an attempt that resumes compiles a training step the first attempt had already stored. Gives
    every attempt the loaded state's type (the values, and so the training, are the same)."""
    if not getattr(state.step, "weak_type", False):
        return state
    return eqx.tree_at(lambda s: s.step, state, jax.lax.convert_element_type(state.step, jnp.int32))


#: How Levanter's ``tree_deserialize_leaves_tensorstore`` begins the message of the one error that lists paths a
#: checkpoint does not store (defect 36).
_MISSING_PATHS = "Missing paths: "


def missing_checkpoint_paths(error: BaseException) -> Optional[list[str]]:
    """Defect 36. The paths a checkpoint does not store, if ``error`` is Levanter's report of them; None for any other
    error, a ``FileNotFoundError`` of a missing checkpoint or of a storage failure included (Levanter raises the same
    class for all three and tells them apart only in the message)."""
    import ast

    message = str(error)
    if type(error) is not FileNotFoundError or not message.startswith(_MISSING_PATHS):
        return None
    try:
        paths = ast.literal_eval(message[len(_MISSING_PATHS) :])
    except (ValueError, SyntaxError):
        return None
    return [str(p) for p in paths] if isinstance(paths, list) and paths else None
