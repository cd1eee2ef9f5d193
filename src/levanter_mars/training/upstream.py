"""Every workaround for a defect of the pinned Levanter (1.2.dev1644), in one place.

Each one names the defect it works around; ``tests/test_upstream_workarounds.py`` reproduces each defect against
the installed Levanter, so that the day upstream fixes one, its test fails and the workaround can be deleted.
Defects that need no code here (only a pin or a default) are listed too, with where they are handled.

1. ``LambdaCallback.on_step(info, force)`` drops ``force``, so the end-of-training checkpoint is never written:
   :func:`forward_force_to_checkpointer`.
2. ``Trainer._train_step``'s ``obj_fun`` unpacks ``(loss, metrics)`` from a loss function that returns one value,
   is not microbatched, and ``take_train_step`` passes ``loss=`` along: the trainer builds its own objective
   (:class:`levanter_mars.training.trainer.BatchObjective`), and MARS calls ``obj_fn(params)`` only.
3. ``Gpt2Config.hf_checkpoint_converter`` hard-codes ``reference_checkpoint="gpt2"`` and so contacts the HF hub
   on every run: :func:`offline_gpt2_converter`.
4. ``train_lm.main`` constructs ``levanter.trainer.Trainer`` itself, with no way to pass a subclass:
   :func:`use_trainer_class`.
5. Training ends quietly when the data runs out before ``num_train_steps``: ``MarsTrainer.train`` raises instead.
6. Not declared by Levanter: ``chex`` (``levanter.optim``) and ``GitPython`` (``levanter.tracker``): pinned in
   ``pyproject.toml``.
7. Levanter's loss passes a float ``where=`` mask, an error from jax 0.8: ``jax==0.7.2`` is pinned.
8. Levanter's own ``mars`` calls ``jax.tree_map`` (removed from jax): we register ``mars-*`` names instead, and
   the benchmarks patch it while they build and trace it (``levanter_mars.bench.optimizers.levanter_mars_workaround``).
9. The default tracker (wandb, online) fails without an API key: ``MarsTrainerConfig`` defaults to offline wandb.
10. ``DataLoaderIterator`` starts a prefetch thread at construction and has no public way to stop it; if the
    process exits while it is still reading (a run resumed when already complete, or stopped by an error), the
    interpreter aborts (``terminate called ...``, exit 134): :func:`stop_data_loader`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

from levanter.callbacks import Callback, LambdaCallback
from levanter.checkpoint import Checkpointer

logger = logging.getLogger(__name__)


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


def offline_gpt2_converter(tokenizer: Any) -> Callable[..., Any]:
    """Defect 3. A ``Gpt2Config.hf_checkpoint_converter`` that builds the HF config locally and uses ``tokenizer``."""
    import transformers
    from levanter.compat.hf_checkpoints import HFCheckpointConverter

    def hf_checkpoint_converter(self, ref_checkpoint: str | None = None):
        return HFCheckpointConverter(
            self.__class__,
            reference_checkpoint=ref_checkpoint,
            HfConfigClass=transformers.GPT2Config,
            tokenizer=tokenizer,
            ignore_prefix="transformer",
        )

    return hf_checkpoint_converter


def stop_data_loader(iterator: Any) -> None:
    """Defect 10. Stops a ``DataLoaderIterator``'s background prefetching (what its ``__del__`` does)."""
    background = getattr(iterator, "_batches", None)
    if background is not None and hasattr(background, "stop"):
        background.stop()


@contextlib.contextmanager
def patched(target: Any, **attributes: Any) -> Iterator[None]:
    """Temporarily sets attributes on a module or class, restoring them afterwards."""
    missing = object()
    saved = {name: getattr(target, name, missing) for name in attributes}
    for name, value in attributes.items():
        setattr(target, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(target, name)
            else:
                setattr(target, name, value)


@contextlib.contextmanager
def use_trainer_class(trainer_factory: Callable[..., Any]) -> Iterator[None]:
    """Defect 4. Makes ``levanter.main.train_lm.main`` construct ``trainer_factory`` instead of ``Trainer``."""
    import levanter.main.train_lm as train_lm

    with patched(train_lm, Trainer=trainer_factory):
        yield


@contextlib.contextmanager
def gpt2_without_hub(tokenizer: Any) -> Iterator[None]:
    """Defect 3, applied for the duration of a run."""
    from levanter.models.gpt2 import Gpt2Config

    with patched(Gpt2Config, hf_checkpoint_converter=offline_gpt2_converter(tokenizer)):
        yield
