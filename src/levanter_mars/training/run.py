"""One training run, end to end: prepare, validate, train with Levanter, summarize."""

from __future__ import annotations


import datetime
import functools
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import draccus
import levanter.main.train_lm
from levanter.optim import OptimizerConfig

from levanter_mars.eval import in_training
from levanter_mars.training import checkpoints
from levanter_mars.training import data as data_lib
from levanter_mars.training import pydocs_corpus, upstream, validation
from levanter_mars.training.config import TrainLmConfig
from levanter_mars.training.metrics import METRICS_FILENAME, read_metrics
from levanter_mars.training.plots import plot_loss_curves
from levanter_mars.training.trainer import MarsTrainer

logger = logging.getLogger(__name__)

# Fields that do not change what is trained, and so do not change the derived run id.
_ID_EXCLUDED = ("fresh", "plot")
_TRAINER_ID_EXCLUDED = ("id", "tracker", "log_dir", "checkpointer", "load_checkpoint", "load_checkpoint_path", "ray")


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    run_dir: str
    checkpoint_dir: str
    metrics_file: str
    steps_completed: int
    final_train_loss: Optional[float]
    first_eval_loss: Optional[float]
    final_eval_loss: Optional[float]
    loss_curve: Optional[str]

    def describe(self) -> str:
        lines = [f"Run {self.run_id}: {self.steps_completed} steps done."]
        if self.final_train_loss is not None:
            lines.append(f"  final train loss: {self.final_train_loss:.4f}")
        if self.final_eval_loss is not None:
            lines.append(f"  eval loss: {self.first_eval_loss:.4f} (first) -> {self.final_eval_loss:.4f} (last)")
        lines.append(f"  metrics:     {self.metrics_file}")
        lines.append(f"  checkpoints: {self.checkpoint_dir}")
        if self.loss_curve:
            lines.append(f"  loss curve:  {self.loss_curve}")
        return "\n".join(lines)


def optimizer_type_name(optimizer: OptimizerConfig) -> str:
    for name, cls in OptimizerConfig.get_known_choices().items():
        if type(optimizer) is cls:
            return name
    return type(optimizer).__name__


def describe_run(config: TrainLmConfig) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed: recorded in each checkpoint manifest."""
    optimizer = {"type": optimizer_type_name(config.optimizer)}
    for key in ("exact", "optimize_1d", "learning_rate", "learning_rate_1d", "gamma"):
        if hasattr(config.optimizer, key):
            optimizer[key] = getattr(config.optimizer, key)
    return {"optimizer": optimizer, "model": {"type": type(config.model).__name__}}


def stable_run_id(config: TrainLmConfig) -> str:
    """``trainer.id``, else ``$RUN_ID``, else a name derived from the config, so the same command resumes."""
    if config.trainer.id:
        return config.trainer.id
    if os.environ.get("RUN_ID"):
        return os.environ["RUN_ID"]
    encoded = draccus.encode(config)
    for key in _ID_EXCLUDED:
        encoded.pop(key, None)
    for key in _TRAINER_ID_EXCLUDED:
        encoded.get("trainer", {}).pop(key, None)
    digest = hashlib.sha256(json.dumps(encoded, sort_keys=True, default=str).encode()).hexdigest()[:8]
    model = type(config.model).__name__.removesuffix("Config").lower()
    return f"{model}-{optimizer_type_name(config.optimizer)}-{digest}"


def _set_aside(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    destination = f"{path.rstrip('/')}.old-{stamp}"
    suffix = 1
    while os.path.exists(destination):  # two --fresh runs within a second: never move one run into another
        suffix += 1
        destination = f"{path.rstrip('/')}.old-{stamp}-{suffix}"
    shutil.move(path, destination)
    logger.warning("fresh=true: moved %s to %s", path, destination)
    return destination


def wandb_offline_unless_configured(config: TrainLmConfig) -> None:
    """W&B is online only when configured to be: an explicit ``mode``, ``WANDB_MODE``, or an API key. Otherwise a
    wandb tracker would fail without credentials (upstream defect 9), so it logs offline and says so."""
    from levanter.tracker.wandb import WandbConfig

    trackers = config.trainer.tracker if isinstance(config.trainer.tracker, tuple) else (config.trainer.tracker,)
    configured = os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY")
    for tracker in trackers:
        if isinstance(tracker, WandbConfig) and tracker.mode is None and not configured:
            tracker.mode = "offline"
            logger.warning("No WANDB_API_KEY or WANDB_MODE: logging to W&B offline (sync later with `wandb sync`).")
        offline = isinstance(tracker, WandbConfig) and tracker.mode in ("offline", "disabled")
        if offline and "WANDB_MODE" not in os.environ:
            # wandb 0.31's wandb-core service resolves api.forge.coreweave.com at shutdown when the mode comes only
            # from wandb.init(mode="offline"); with WANDB_MODE in its environment it stays off the network.
            os.environ["WANDB_MODE"] = tracker.mode


def run_dir(config: TrainLmConfig) -> Path:
    return Path(config.trainer.log_dir) / config.trainer.id


def train(config: TrainLmConfig) -> RunSummary:
    """Runs (or resumes) training. Raises ConfigError before any compilation if the config is bad."""
    # Levanter turns on INFO for its own loggers only; ours report resumes and skipped checkpoints.
    package_logger = logging.getLogger("levanter_mars")
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO)
    config.trainer.id = stable_run_id(config)
    if config.embedded_corpus:
        pydocs_corpus.prepare(config.embedded_corpus)
    validation.validate(config)
    wandb_offline_unless_configured(config)
    data_lib.build_local_caches(config.data)

    checkpoint_dir = config.trainer.checkpointer.expanded_path(config.trainer.id)
    if config.fresh:
        for path in (str(run_dir(config)), checkpoint_dir):
            _set_aside(path)
    run_info = describe_run(config)
    if config.trainer.load_checkpoint is not False:
        newest = checkpoints.newest_usable(config.trainer.load_checkpoint_path or checkpoint_dir)
        if newest is not None:
            checkpoints.check_compatible(newest, run_info)  # before anything is built or compiled

    trainer_factory = functools.partial(MarsTrainer, run_info=run_info)
    eval_hook_factory = in_training.hook_factory(run_dir=str(run_dir(config)), run_name=config.trainer.id)
    with (
        upstream.use_trainer_class(trainer_factory),
        upstream.gpt2_without_hub(config.data.the_tokenizer),
        upstream.use_eval_harness_hook(eval_hook_factory),
    ):
        levanter.main.train_lm.main(config)
    return summarize(config)


def summarize(config: TrainLmConfig) -> RunSummary:
    directory = run_dir(config)
    metrics_file = directory / METRICS_FILENAME
    records = read_metrics(metrics_file)
    train_losses = [r["train/loss"] for r in records if isinstance(r.get("train/loss"), float)]
    eval_losses = [r["eval/loss"] for r in records if isinstance(r.get("eval/loss"), float)]
    curve = None
    if config.plot and records:
        curve = plot_loss_curves(
            {config.trainer.id: metrics_file}, directory / "loss_curve.png", title=f"{config.trainer.id}"
        )
    return RunSummary(
        run_id=config.trainer.id,
        run_dir=str(directory),
        checkpoint_dir=config.trainer.checkpointer.expanded_path(config.trainer.id),
        metrics_file=str(metrics_file),
        steps_completed=max((r["step"] + 1 for r in records), default=0),
        final_train_loss=train_losses[-1] if train_losses else None,
        first_eval_loss=eval_losses[0] if eval_losses else None,
        final_eval_loss=eval_losses[-1] if eval_losses else None,
        loss_curve=curve,
    )



