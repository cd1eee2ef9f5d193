"""The in-training eval programs, lowered on the slice like the train step: the eval loss and the harness batch.

Both run between train steps, on the model the train state holds, at ``trainer.EvalBatch`` (``trainer.
per_device_eval_parallelism`` sequences per chip, never microbatched):

- eval loss: Levanter's ``TaggedEvaluator`` step (``accum_for_batch``), the one ``training/lm._add_eval_loss``
  installs, built here on empty stand-in datasets that carry the config's eval tags (only their shapes matter). It is
  built without the tokenizer, so without the bits-per-byte sums (a vocabulary-sized int32 table and a few per-tag
  scalars: nothing next to the logits);
- eval harness: one batch of packed log-likelihood rows, scored as training scores them (``compat.lm_eval_scoring``),
  at the suite's ``max_length`` or the model's ``seq_len``.
"""

from __future__ import annotations

from typing import Any, Optional

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from levanter.data.dataset import ListAsyncDataset
from levanter.eval import TaggedEvaluator
from levanter.models.lm_model import LmExample
from levanter.utils.tree_utils import inference_mode

from levanter_mars.compat.levanter_training import eval_loss_running_state
from levanter_mars.compat.lm_eval_scoring import ScoringRows, scoring_program
from levanter_mars.infra.preflight.step import TrainStep, causal_examples, on_mesh, with_shardings

EVAL_LOSS, EVAL_HARNESS = "eval_loss", "eval_harness"


def _lower(program, model, *args) -> Any:
    """Lowers ``program(model, *args)`` as the eval hooks call it: on the eval model (``StepInfo.eval_model``,
    inference mode, its flags static). Under a plain jax.jit, as the train step is: haliax's named_jit would take the
    abstract shapes for static arguments; the outer jit turns them into tracers and inlines the sharded program."""
    dynamic, static = eqx.partition(inference_mode(model, True), lambda x: isinstance(x, jax.ShapeDtypeStruct))
    return jax.jit(lambda d, *rest: program(eqx.combine(d, static), *rest)).lower(dynamic, *args)


def eval_tags(data_config) -> list[list[str]]:
    """Per data source that has an eval set, its tags (as Levanter's ``tagged_eval_sets`` gives them), without
    reading any data: a held-out slice (``num_validation_sequences``), validation URLs, or an HF dataset (whose
    validation split, if any, is only known online: counted, so the program that may run is checked)."""
    held_out = getattr(data_config, "num_validation_sequences", None) or {}
    tags = []
    for name, source in data_config.sources.items():
        if held_out.get(name) or getattr(source, "validation_urls", None) or getattr(source, "id", None):
            tags.append(list(source.tags or []) + [name])
    return tags


def _eval_batch(step: TrainStep, Pos: hax.Axis, make) -> Any:
    tokens = jax.ShapeDtypeStruct((step.trainer_config.EvalBatch.size, Pos.size), jnp.int32)
    return with_shardings(eqx.filter_eval_shape(make, tokens), step.trainer.compute_axis_mapping, step.mesh)


def lower_eval_loss(step: TrainStep, Pos: hax.Axis, tags: list[list[str]], eos_id: Optional[int]) -> Any:
    EvalBatch = step.trainer_config.EvalBatch
    # Its data loader (never iterated) reads one example and probes its mesh eagerly, which the abstract TPU devices
    # cannot run: it gets one stand-in example and this machine's CPU device as its mesh. The jitted step it builds
    # takes the compute axis mapping, which is all that decides the program's shardings.
    stand_in = LmExample.causal(hax.zeros(Pos, dtype=jnp.int32), eos_id=eos_id)
    datasets = [(ListAsyncDataset([stand_in], is_complete=True), source_tags) for source_tags in tags]
    cpu_mesh = Mesh(np.array(jax.devices("cpu")[:1]).reshape(1, 1, 1), tuple(step.mesh.axis_names))
    evaluator = TaggedEvaluator(EvalBatch, datasets, None, cpu_mesh, step.trainer.compute_axis_mapping,
                                step.trainer_config.max_eval_batches, mp=step.trainer.mp)
    Tag = evaluator.dataset.Tag
    with on_mesh(step):
        batch = _eval_batch(step, Pos, causal_examples(EvalBatch, Pos, eos_id))
        batch_tags = with_shardings(
            hax.NamedArray(jax.ShapeDtypeStruct((EvalBatch.size, Tag.size), jnp.int32), (EvalBatch, Tag)),
            step.trainer.compute_axis_mapping, step.mesh,
        )
        running = with_shardings(eqx.filter_eval_shape(eval_loss_running_state, Tag), {}, step.mesh)
        return _lower(evaluator.accum_for_batch, step.state.model, running, batch, batch_tags)


def lower_harness_batch(step: TrainStep, Pos: hax.Axis) -> Any:
    EvalBatch = step.trainer_config.EvalBatch
    with on_mesh(step):
        def rows(tokens):
            named = hax.named(tokens, (EvalBatch, Pos))
            return ScoringRows(tokens=named, targets=named, segment_ids=named)

        batch = _eval_batch(step, Pos, rows)
        program = scoring_program(step.trainer.compute_axis_mapping, step.trainer.mp)
        return _lower(program, step.state.model, batch)


def lower_eval_programs(step: TrainStep, config, eos_id: Optional[int]) -> dict[str, Any]:
    """Name -> lowered program, for the eval programs ``config`` (a TrainAndEvalConfig) runs during training."""
    programs = {}
    tags = eval_tags(config.data)
    if tags and config.trainer.steps_per_eval:
        programs[EVAL_LOSS] = lower_eval_loss(step, config.model.Pos, tags, eos_id)
    suite = getattr(config, "eval_harness", None)
    if suite is not None:
        Pos = config.model.Pos if suite.max_length is None else config.model.Pos.resize(suite.max_length)
        programs[EVAL_HARNESS] = lower_harness_batch(step, Pos)
    return programs
