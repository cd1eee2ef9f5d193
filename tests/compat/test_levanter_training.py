"""Defects of the pinned Levanter's trainer, data loader and checkpointer that
``levanter_mars.compat.levanter_training`` (and, for defect 5, ``training.trainer``) works around."""

import inspect

import jax.numpy as jnp
import pytest
from levanter.callbacks import LambdaCallback

from levanter_mars.compat import levanter_training
from tests.helpers.compat import one_device_mesh


class _Info:
    step = 7


def test_defect_1_lambda_callback_drops_force(tmp_path):
    seen = []

    def on_step(info, force=False):
        seen.append(force)

    LambdaCallback(on_step).on_step(_Info(), force=True)
    assert seen == [False], "upstream now forwards force: remove forward_force_to_checkpointer"


def test_defect_1_workaround_forwards_force_to_the_checkpointer(tmp_path):
    from levanter.checkpoint import Checkpointer
    from levanter.trainer import _Hook

    class RecordingCheckpointer(Checkpointer):
        def __init__(self):
            super().__init__(tmp_path, None, [])
            self.forced = []

        def on_step(self, info, force=False):
            self.forced.append(force)

    checkpointer = RecordingCheckpointer()
    hooks = [_Hook(LambdaCallback(lambda info: None), 1), _Hook(LambdaCallback(checkpointer.on_step), 1)]
    assert levanter_training.forward_force_to_checkpointer(hooks) is checkpointer
    for hook in hooks:
        hook.fn.on_step(_Info(), force=True)
    assert checkpointer.forced == [True]


def test_defect_2_obj_fun_unpacks_a_pair_the_loss_does_not_return():
    source = inspect.getsource(__import__("levanter.trainer", fromlist=["Trainer"]).Trainer._train_step)
    assert "loss_for_opt, _metrics = result" in source
    from levanter.models.lm_model import compute_next_token_loss

    # The LM loss returns a single value, so that unpacking fails for every Levanter language model.
    assert "tuple" not in str(inspect.signature(compute_next_token_loss).return_annotation).lower()


def test_defect_2_take_train_step_passes_loss_to_the_optimizer():
    import optax
    from levanter.trainer_state import take_train_step

    received = {}

    def update(updates, state, params=None, **extra):
        received.update(extra)
        return updates, state

    tx = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    params = {"w": jnp.ones(2)}
    take_train_step(tx, params, tx.init(params), params, obj_fun=lambda p: 0.0, loss=1.0)
    assert "loss" in received and "obj_fn" in received, received


def test_defect_5_upstream_train_returns_quietly_when_data_runs_out():
    from levanter.trainer import Trainer

    source = inspect.getsource(Trainer.training_steps)
    assert "Reached end of training data loader" in source and "break" in source
    # train() only complains when *no* step ran; stopping early otherwise goes unreported.
    train_source = inspect.getsource(Trainer.train)
    assert train_source.count("raise") == 1 and "if info is None" in train_source


def test_defect_2_the_copied_train_step_fails_loudly_when_upstreams_changes(monkeypatch):
    from levanter.trainer import Trainer

    levanter_training.check_copied_train_step_is_current()  # the pinned Levanter: the copy is of this very source
    original = Trainer._train_step

    def changed(self, state, batch, batch_kwargs, _no_hooks=False):  # what any upstream edit looks like to the hash
        return original(self, state, batch, batch_kwargs, _no_hooks)

    monkeypatch.setattr(Trainer, "_train_step", changed)
    with pytest.raises(RuntimeError, match="Trainer._train_step changed"):
        levanter_training.check_copied_train_step_is_current()
    with pytest.raises(RuntimeError, match="COPIED_TRAIN_STEP_SHA256"):  # before the trainer uses any argument
        levanter_training.FixedTrainer(None, None, None)


def test_defect_10_data_loader_prefetch_thread_has_no_public_stop():
    import numpy as np
    from levanter.data import DataLoader
    from levanter.data.dataset import ListAsyncDataset

    with one_device_mesh():
        data = ListAsyncDataset([np.arange(4, dtype=np.int32)] * 64, is_complete=True)
        iterator = iter(DataLoader(data, batch_size=2, max_buffered_batches=2))
        next(iterator)
        thread = iterator._batches.thread
        assert thread.is_alive()  # blocked on its full queue, 31 batches to go
        assert not [name for name in ("stop", "close", "shutdown") if hasattr(iterator, name)]
        levanter_training.stop_data_loader(iterator)
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_defect_32_the_jitted_train_step_has_no_public_handle():
    import functools

    from levanter.trainer import Trainer

    assert not [name for name in dir(Trainer) if "jit" in name and not name.startswith("_")]
    assert isinstance(Trainer.__dict__["_jit_train_step_fn"], functools.cached_property)
    assert levanter_training.jitted_train_step.__doc__.startswith("Defect 32")
    import levanter.eval

    assert not [name for name in dir(levanter.eval) if "RunningMeans" in name and not name.startswith("_")]
    public = [name for name in dir(levanter.eval.TaggedEvaluator) if not name.startswith("_")]
    assert not [name for name in public if "state" in name or "zeros" in name], public
    assert levanter_training.eval_loss_running_state.__doc__.startswith("Defect 32")
