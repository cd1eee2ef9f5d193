"""Evaluating a checkpoint on a suite, outside training.

What is evaluated (:mod:`levanter_mars.eval.checkpoint_source` finds it):

* a levanter-mars/Levanter checkpoint ``.../<run id>/step-N`` (only its ``model/`` is read);
* a run's checkpoint directory ``.../<run id>``: its newest complete checkpoint (the one training would resume from;
  incomplete or corrupt ones are skipped, see :mod:`levanter_mars.training.checkpointing.audit`);
* nothing given: the run checkpoint directory named by the training config;
* an exported HF checkpoint directory (``config.json`` + weights, e.g. from ``hf_save_path``).

A Levanter checkpoint holds arrays only, so the model config, tokenizer, mixed precision, mesh and eval batch size
come from the run's training YAML (``train_config_path``): the same values as the in-training evaluation, which is
what makes the two agree exactly on the same checkpoint. An HF checkpoint brings its own model config and tokenizer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
from dataclasses import dataclass
from typing import Optional

import equinox as eqx
import haliax as hax
import jax
from haliax.partitioning import round_axis_for_partitioning
from levanter.checkpoint import load_checkpoint
from levanter.compat.hf_checkpoints import load_tokenizer
from levanter.distributed import RayConfig
from levanter.models.gpt2 import Gpt2Config
from levanter.tracker import NoopConfig
from levanter.utils.tree_utils import inference_mode

from levanter_mars.compat.levanter_logging import log_file_named_by_run_id
from levanter_mars.compat.levanter_models import hf_converter
from levanter_mars.compat.lm_eval_harness import run_eval_harness
from levanter_mars.eval import report
from levanter_mars.eval.checkpoint_source import CheckpointSource, resolve_checkpoint
from levanter_mars.eval.suite import EvalSuiteConfig
from levanter_mars.program_config import TrainAndEvalConfig, parse_train_config
from levanter_mars.program_logging import set_up_program_logging
from levanter_mars.training.checkpointing.audit import STEP_DIR
from levanter_mars.training.errors import CheckpointError
from levanter_mars.training.config import ConfigError
from levanter_mars.training.run.identity import stable_run_id
from levanter_mars.training.trainer import MarsTrainerConfig

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class EvalHarnessMainConfig(EvalSuiteConfig):
    """An eval suite (the fields of ``config/eval/*.yaml``) plus what to evaluate and where results go."""

    checkpoint_path: Optional[str] = None
    """A checkpoint (``.../step-N``), a run's checkpoint directory (newest complete checkpoint), or an exported HF
    checkpoint directory. Default: the run checkpoint directory of ``train_config_path``."""
    train_config_path: Optional[str] = None
    """The run's training YAML: model, tokenizer, mixed precision, mesh and eval batch size. Required for Levanter
    checkpoints; optional for HF checkpoints."""
    checkpoint_is_hf: Optional[bool] = None
    """Whether ``checkpoint_path`` is an HF checkpoint. Default: yes if it has config.json and no metadata.json."""
    tokenizer: Optional[str] = None
    """Overrides the tokenizer (default: the HF checkpoint's own, else ``data.tokenizer`` of the training YAML)."""
    output_dir: Optional[str] = None
    """Default: ``<log_dir>/<run id>/eval/<suite>/step-N`` (or ``.../hf-step-N``) for a checkpoint of the training
    YAML's run (or of a run of it with another ``trainer.id``); next to any other checkpoint,
    ``<its run dir>/eval/<suite>/step-N``; ``eval_results/<name>/<suite>`` for an HF checkpoint without a YAML."""
    run_name: Optional[str] = None
    """The row label in the results table. Default: the run id (or the HF checkpoint's directory name)."""
    model_axis_size: Optional[int] = None
    """Overrides ``trainer.model_axis_size`` (e.g. 1 to evaluate on fewer devices than training used)."""
    per_device_eval_parallelism: Optional[int] = None
    """Overrides ``trainer.per_device_eval_parallelism`` (eval batch = this x data-parallel devices)."""
    verify_checksums: bool = True
    """Verify the checkpoint's files against its manifest before reading it."""
    download_only: bool = False
    """Only load the suite's tasks (downloading their datasets into the HF datasets cache), then exit."""


@dataclass(frozen=True)
class EvalReport:
    source: CheckpointSource
    written: report.WrittenResults
    outputs: dict


def load_train_config(path: str) -> TrainAndEvalConfig:
    try:
        return parse_train_config(["--config_path", path])
    except ConfigError as e:
        raise ConfigError(f"train_config_path {path!r}: {e}") from e


def _trainer_config(config: EvalHarnessMainConfig, train: Optional[TrainAndEvalConfig]) -> MarsTrainerConfig:
    """The training run's trainer settings, made suitable for a one-off evaluation (no tracker, no Ray)."""
    trainer = train.trainer if train is not None else MarsTrainerConfig()
    overrides = {"tracker": NoopConfig(), "ray": RayConfig(auto_start_cluster=False)}
    if train is not None:
        overrides["id"] = stable_run_id(train)
    if config.model_axis_size is not None:
        overrides["model_axis_size"] = config.model_axis_size
    if config.per_device_eval_parallelism is not None:
        overrides["per_device_eval_parallelism"] = config.per_device_eval_parallelism
    return dataclasses.replace(trainer, **overrides)


def _tokenizer_name(
    config: EvalHarnessMainConfig, train: Optional[TrainAndEvalConfig], source: CheckpointSource
) -> str:
    if config.tokenizer:
        return config.tokenizer
    if source.is_hf:
        return source.path
    assert train is not None
    return train.data.tokenizer


def _hf_name(path: str) -> tuple[str, Optional[int]]:
    """An HF export's run name and step: ``<hf_save_path>/<run id>/step-N`` gives (run id, N)."""
    parent, name = posixpath.split(path.rstrip("/"))
    match = STEP_DIR.fullmatch(name)
    return (posixpath.basename(parent) or name, int(match.group(1))) if match else (name, None)


def _comparable(path: str) -> str:
    path = path.rstrip("/")
    return path if "://" in path else os.path.realpath(path)


def checkpoint_run_id(train: TrainAndEvalConfig, source: CheckpointSource) -> str:
    """The run a checkpoint belongs to: the training config's run, unless the checkpoint lies outside that run's
    checkpoint directory (another run, e.g. one trained with ``--trainer.id`` or another ``log_dir``); then the name
    of the directory holding it (``<base>/<run id>/step-N``, or an HF export's ``<hf_save_path>/<run id>/step-N``).
    Without this, evaluating run B's checkpoint with run A's YAML would label the row as A."""
    own = stable_run_id(train)
    if source.is_hf:
        name, step = _hf_name(source.path)
        return name if step is not None else own
    run_dir = posixpath.dirname(source.path.rstrip("/"))
    name = posixpath.basename(run_dir)
    if not name or _comparable(run_dir) == _comparable(train.trainer.checkpointer.expanded_path(own)):
        return own
    return name


def _same_layout(train: TrainAndEvalConfig, source: CheckpointSource, run_id: str) -> bool:
    """Whether the checkpoint sits where the training config would put run ``run_id``'s checkpoints: then that run
    shares the config's ``log_dir`` (a run of the same YAML with another ``trainer.id``)."""
    if source.is_hf:
        return run_id == stable_run_id(train)
    run_dir = posixpath.dirname(source.path.rstrip("/"))
    return _comparable(run_dir) == _comparable(train.trainer.checkpointer.expanded_path(run_id))


def default_output_dir(
    config: EvalHarnessMainConfig,
    train: Optional[TrainAndEvalConfig],
    source: CheckpointSource,
    suite: str,
    run_id: Optional[str] = None,
) -> str:
    """``--output_dir``; else the run's own ``<log_dir>/<run id>/eval/<suite>/<leaf>`` when the training config
    describes the checkpoint's run; else next to the checkpoint, ``<its run dir>/eval/<suite>/<leaf>``: never into
    the tree of a run the checkpoint does not belong to."""
    if config.output_dir:
        return config.output_dir
    if source.is_hf:
        name, step = _hf_name(source.path)
        leaf = f"hf-step-{step}" if step is not None else f"hf-{name}"
    else:
        leaf = f"step-{source.step}"
    if train is None:
        return posixpath.join("eval_results", _hf_name(source.path)[0], suite, leaf)
    run_id = run_id or checkpoint_run_id(train, source)
    if _same_layout(train, source, run_id):
        return posixpath.join(str(train.trainer.log_dir), run_id, "eval", suite, leaf)
    beside = posixpath.join(posixpath.dirname(source.path.rstrip("/")), "eval", suite, leaf)
    logger.warning(
        "Checkpoint %s is not one of the training config's run %r: its results are labelled %r and written next to "
        "it, to %s (set --run_name / --output_dir to choose)", source.path, stable_run_id(train), run_id, beside,
    )
    return beside


def eval_log_name(run_id: str) -> str:
    """The evaluation's log is ``<log_dir>/<run id>.eval.log``: beside the run's training log, never appended to it
    (another program, possibly while the run still trains)."""
    return f"{run_id}.eval"


def _load_model(source: CheckpointSource, model_config, tokenizer, trainer: MarsTrainerConfig):
    mapping = trainer.parameter_axis_mapping
    if source.is_hf:
        converter = hf_converter(model_config, tokenizer).replaced(reference_checkpoint=source.path)
        return converter.load_pretrained(
            model_config.model_type, ref=source.path, dtype=trainer.mp.param_dtype, axis_mapping=mapping
        )
    # As train_lm builds it, so that the arrays load into the same shapes and shardings.
    Vocab = round_axis_for_partitioning(hax.Axis("vocab", len(tokenizer)), mapping)
    shape = eqx.filter_eval_shape(model_config.build, Vocab, key=jax.random.PRNGKey(0))
    try:
        return load_checkpoint(
            shape, source.path, subpath="model", discover_latest=False, axis_mapping=mapping, mesh=trainer.device_mesh
        )
    except Exception as e:  # noqa: BLE001 - a mismatch shows up as one of many tensorstore/shape errors
        raise CheckpointError(
            f"checkpoint {source.path} does not load into the model of the training config "
            f"({type(e).__name__}: {e}). Is train_config_path the YAML this run was trained with?"
        ) from e


def evaluate(config: EvalHarnessMainConfig, *, suite: str = "suite") -> Optional[EvalReport]:
    """Evaluates the checkpoint and writes results.json and results.md; returns None on processes other than 0."""
    set_up_program_logging()
    if config.download_only:
        tasks = config.to_task_dict()
        logger.info("Loaded %d tasks; their datasets are in the HF datasets cache.", len(tasks))
        return None
    train = load_train_config(config.train_config_path) if config.train_config_path else None
    path, named_by = config.checkpoint_path, "checkpoint_path"
    if path is None:
        if train is None:
            raise ConfigError("checkpoint_path: give a checkpoint, or train_config_path to evaluate that run's newest")
        path = train.trainer.checkpointer.expanded_path(stable_run_id(train))
        named_by = "checkpoint_path (not given: the run checkpoint directory of train_config_path)"
    source = resolve_checkpoint(
        path, is_hf=config.checkpoint_is_hf, verify_checksums=config.verify_checksums, named_by=named_by
    )
    if not source.is_hf and train is None:
        raise ConfigError(
            f"train_config_path: {source.path} is a Levanter checkpoint, which holds arrays only; pass the training "
            "YAML of its run so that the model, tokenizer and precision are known"
        )
    hf_name, hf_step = _hf_name(source.path) if source.is_hf else (None, None)
    run_id = hf_name if train is None else checkpoint_run_id(train, source)
    model_config = train.model if train is not None else Gpt2Config()
    tokenizer = load_tokenizer(_tokenizer_name(config, train, source))
    trainer = _trainer_config(config, train)
    with log_file_named_by_run_id(eval_log_name(run_id)):
        trainer.initialize()
    logger.info("Evaluating %s on %d device(s)", source.path, jax.device_count())
    tasks = config.to_task_dict()
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.parameter_axis_mapping):
        model = inference_mode(_load_model(source, model_config, tokenizer, trainer), True)
        outputs = run_eval_harness(
            config, model, tasks, tokenizer, trainer.EvalBatch, trainer.compute_axis_mapping, trainer.mp
        )
    if jax.process_index() != 0:
        return None
    assert outputs is not None
    run_name = config.run_name or run_id
    written = report.write_results(
        outputs, default_output_dir(config, train, source, suite, run_id), run_name=run_name,
        step=source.step if not source.is_hf else hf_step, checkpoint=source.path, columns=config.columns,
    )
    return EvalReport(source, written, outputs)
