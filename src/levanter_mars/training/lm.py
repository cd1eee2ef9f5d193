"""Builds and trains a language model: what Levanter's ``train_lm.main`` does, with :class:`MarsTrainer`.

Called by the entry point once ``jax.distributed`` is up and the config is validated; the entry point decides what is
resumed (:class:`~levanter_mars.training.checkpointing.resume.ResumePlan`) and which extra hooks (evaluations) run.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Optional

import jax.numpy as jnp
import jax.random as jrandom
import levanter
import levanter.eval
from haliax import Axis
from haliax.partitioning import round_axis_for_partitioning
from levanter import callbacks
from levanter.checkpoint import load_checkpoint
from levanter.compat.hf_checkpoints import save_hf_checkpoint_callback
from levanter.models.lm_model import compute_next_token_loss
from levanter.utils.jax_utils import parameter_count

from levanter_mars.compat import levanter_slices
from levanter_mars.compat.levanter_data_mesh import auto_axes_data_mesh
from levanter_mars.compat.levanter_loss import boolean_loss_masks
from levanter_mars.compat.levanter_models import differentiable_loss, hf_converter
from levanter_mars.optim.role_audit import audit_model
from levanter_mars.training.config import TrainLmConfig
from levanter_mars.training.checkpointing.resume import ResumePlan
from levanter_mars.training.run.goodput import clock as goodput_clock
from levanter_mars.training.run.goodput import GoodputRecord
from levanter_mars.training.run.lease import RunLease
from levanter_mars.training.run import resize
from levanter_mars.training.trainer import MarsTrainer

logger = logging.getLogger(__name__)

#: ``(trainer, tokenizer) -> None``: adds hooks (an eval suite, say) once the trainer exists.
HookInstaller = Callable[[MarsTrainer, object], None]


def train_lm(config: TrainLmConfig, *, run_info: dict, resume: Optional[ResumePlan], add_hooks: HookInstaller,
             goodput: Optional[GoodputRecord] = None, lease: Optional[RunLease] = None):  # fmt: skip
    tokenizer = config.data.the_tokenizer
    converter = hf_converter(config.model, tokenizer)

    with build_trainer(config, run_info=run_info, resume=resume, goodput=goodput, lease=lease) as trainer:
        data_key, _loader_key, model_key, training_key = jrandom.split(jrandom.PRNGKey(config.trainer.seed), 4)
        if config.data_seed is not None:
            data_key = jrandom.PRNGKey(config.data_seed)
        Pos = config.model.Pos
        Vocab = vocab_axis(len(tokenizer), trainer)

        _log_role_audit(config, Vocab)
        train_dataset = config.data.train_set(Pos, config.trainer.batch_schedule, key=data_key, epochs=config.epoch)
        state = trainer.initial_state(training_key, model_init=lambda: config.model.build(Vocab, key=model_key))
        if int(state.step) == 0 and config.initialize_from_checkpoint_path is not None:
            state = load_checkpoint(state, config.initialize_from_checkpoint_path)
        levanter.tracker.log_summary({"parameter_count": parameter_count(state.model)})

        _add_eval_loss(trainer, config, tokenizer)
        flops_per_token = config.model.flops_per_token(len(tokenizer))
        flops_per_example = 3 * flops_per_token * Pos.size if flops_per_token is not None else None
        trainer.add_hook(
            callbacks.log_performance_stats(Pos.size, trainer.config.batch_schedule, flops_per_example), every=1
        )
        if config.hf_save_path is not None and config.hf_save_steps is not None:
            _add_hf_export(trainer, config, converter)
        add_hooks(trainer, tokenizer)

        # Each host reads its share of the batches, from the step the run resumes at.
        train_loader = trainer.data_loader(train_dataset).iter_from_step(int(state.step))
        trainer.train(state, train_loader)
    trainer.tracker.finish()


def build_trainer(config: TrainLmConfig, *, run_info: dict, resume: Optional[ResumePlan],
                  goodput: Optional[GoodputRecord] = None, lease: Optional[RunLease] = None) -> MarsTrainer:  # fmt: skip
    """The trainer, its optimizer and loss, as training runs them (pre-flight compiles the same step)."""
    boolean_loss_masks()  # the training and eval losses (and pre-flight's), on jax >= 0.8 (compat entry 7)
    auto_axes_data_mesh()  # the data loader's batches, on jax >= 0.10 (compat entry 35)
    logger.info("Mesh: %s", levanter_slices.describe_mesh(config.trainer))
    optimizer = config.optimizer.build(config.trainer.num_train_steps)
    loss_function = differentiable_loss(
        functools.partial(compute_next_token_loss, logsumexp_weight=config.z_loss_weight)
    )
    return MarsTrainer(config.trainer, optimizer, loss_function, run_info=run_info, resume=resume, goodput=goodput,
                       lease=lease, resize_request=resize.for_this_launch(config))


def vocab_axis(vocab_size: int, trainer: MarsTrainer) -> Axis:
    # Partitioned dimensions must divide the mesh; tokenizers have odd sizes (GPT-2's 50257), so round up.
    return round_axis_for_partitioning(Axis("vocab", vocab_size), trainer.parameter_axis_mapping)


def _log_role_audit(config: TrainLmConfig, Vocab: Axis) -> None:
    """Which optimizer branch every parameter takes (``python -m levanter_mars.optim.role_audit`` prints the same)."""
    audit = audit_model(config.model, config.optimizer, Vocab.size)
    logger.info("Tensor roles of model.type=%s:\n%s", type(config.model).__name__, audit.table())
    for warning in audit.warnings:
        logger.warning("Tensor roles: %s", warning)


def _add_eval_loss(trainer: MarsTrainer, config: TrainLmConfig, tokenizer) -> None:
    tagged_eval_datasets = config.data.tagged_eval_sets(config.model.Pos)
    if not tagged_eval_datasets:
        logger.warning("No evaluation datasets provided.")
        return
    max_examples = config.trainer.max_eval_batches
    if max_examples is not None:
        max_examples *= config.trainer.eval_batch_size
    evaluate = levanter.eval.cb_tagged_lm_evaluate(
        config.trainer.EvalBatch, tagged_eval_datasets, tokenizer, trainer.device_mesh,
        trainer.compute_axis_mapping, max_examples, mp=config.trainer.mp,
    )
    trainer.add_hook(goodput_clock.timed("eval", evaluate), every=config.trainer.steps_per_eval)


def _add_hf_export(trainer: MarsTrainer, config: TrainLmConfig, converter) -> None:
    path = config.hf_save_path
    if config.trainer.checkpointer.append_run_id_to_base_path:
        path = os.path.join(path, trainer.run_id)
    save_dtype = jnp.dtype(config.hf_save_dtype) if config.hf_save_dtype is not None else None
    export = save_hf_checkpoint_callback(path, converter, upload_to_hf=config.hf_upload or False, save_dtype=save_dtype)
    trainer.add_hook(goodput_clock.timed("checkpoint", export), every=config.hf_save_steps)
