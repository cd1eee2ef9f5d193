"""A run's identity: its id, its directory, and what a checkpoint must agree with to be resumed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import draccus
from levanter.distributed import DistributedConfig
from levanter.optim import OptimizerConfig

# Fields that do not change what is trained, and so do not change the derived run id.
_ID_EXCLUDED = ("fresh", "take_over", "plot", "eval_harness_failure")
#: Fields added after ids were first derived, with the value every earlier run had: left out of the hash at that value,
#: so runs started before the field existed keep their id.
_FIELDS_ADDED = {"embedded_corpus_sources": "stdlib"}
_TRAINER_ID_EXCLUDED = (
    "id", "tracker", "log_dir", "checkpointer", "load_checkpoint", "load_checkpoint_path", "ray", "compilation_cache",
    "preemption_grace_s",  # how long a notice's save may take: not what is trained
)  # fmt: skip
_DATA_ID_EXCLUDED = ("rebuild_cache",)  # the same data either way: rebuilding a cache must not start a new run


def optimizer_type_name(optimizer: OptimizerConfig) -> str:
    for name, cls in OptimizerConfig.get_known_choices().items():
        if type(optimizer) is cls:
            return name
    return type(optimizer).__name__


#: Fields of the optimizer config that change its state's layout: a checkpoint written with other values cannot be
#: resumed (``checkpointing.compatibility``). ``type`` is the registered optimizer name.
#: Layout options added after runs were first recorded, with the value every earlier run had: a manifest without one
#: means that value, and at that value it is left out of the derived run id, so runs started before it still resume.
LAYOUT_OPTIONS_ADDED = {"amsgrad": False}
_LAYOUT_OPTIONS = ("exact", "optimize_1d", "efficient", *LAYOUT_OPTIONS_ADDED)
OPTIMIZER_LAYOUT_FIELDS = ("type", *_LAYOUT_OPTIONS)
#: Recorded for the record only: these may change between runs.
_OPTIMIZER_HYPERPARAMETERS = ("learning_rate", "learning_rate_1d", "gamma")


def describe_run(config) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed: recorded in each checkpoint manifest."""
    optimizer = {"type": optimizer_type_name(config.optimizer)}
    for key in (*_LAYOUT_OPTIONS, *_OPTIMIZER_HYPERPARAMETERS):
        if hasattr(config.optimizer, key):
            optimizer[key] = getattr(config.optimizer, key)
    return {"optimizer": optimizer, "model": {"type": type(config.model).__name__}}


def stable_run_id(config) -> str:
    """``trainer.id``, else ``$RUN_ID``, else a name derived from the config, so the same command resumes.

    The number of processes and how they find each other are not part of it: a run resumes on another slice."""
    if config.trainer.id:
        return config.trainer.id
    if os.environ.get("RUN_ID"):
        return os.environ["RUN_ID"]
    encoded = draccus.encode(config)
    for key in _ID_EXCLUDED:
        encoded.pop(key, None)
    for key, earlier_value in _FIELDS_ADDED.items():
        if encoded.get(key) == earlier_value:
            del encoded[key]
    for key in _TRAINER_ID_EXCLUDED:
        encoded.get("trainer", {}).pop(key, None)
    for key in _DATA_ID_EXCLUDED:
        encoded.get("data", {}).pop(key, None)
    optimizer = encoded.get("optimizer", {})
    for key, earlier_value in LAYOUT_OPTIONS_ADDED.items():
        if key in optimizer and optimizer[key] == earlier_value:
            del optimizer[key]
    if "trainer" in encoded:
        # Hashed as its default, so that ids derived before multi-host support still resume, and every process
        # (each with its own process_id) derives the same id.
        encoded["trainer"]["distributed"] = draccus.encode(DistributedConfig())
    digest = hashlib.sha256(json.dumps(encoded, sort_keys=True, default=str).encode()).hexdigest()[:8]
    model = type(config.model).__name__.removesuffix("Config").lower()
    return f"{model}-{optimizer_type_name(config.optimizer)}-{digest}"


def run_dir(config) -> Path:
    return Path(config.trainer.log_dir) / config.trainer.id


def log_file(config) -> Path:
    """Levanter's log of the run, every process's lines (``compat.levanter_logging`` fixes its name)."""
    return Path(config.trainer.log_dir) / f"{config.trainer.id}.log"


def checkpoint_dir(config) -> str:
    return config.trainer.checkpointer.expanded_path(config.trainer.id)
