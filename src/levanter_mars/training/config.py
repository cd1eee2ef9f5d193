"""The training config: Levanter's ``TrainLmConfig`` with our trainer, MARS by default, and a few run-level fields.

Parsing goes through Levanter's ``levanter.config.main`` (YAML via ``--config_path``, gs:// URLs, ``--configs a b``,
and ``--section.field value`` overrides); errors come back as a :class:`ConfigError` that names the field. The
program's config, with eval suites, is :class:`levanter_mars.program_config.TrainAndEvalConfig`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import draccus
import levanter.config
from levanter.main import train_lm as upstream_train_lm
from levanter.models.gpt2 import Gpt2Config
from levanter.models.lm_model import LmConfig
from levanter.optim import OptimizerConfig

import levanter_mars.optim.levanter_config  # noqa: F401  (registers mars-adamw, mars-lion, mars-shampoo, mars-m)
from levanter_mars.compat.cli import argparse_errors_raise, help_lists_each_option_once
from levanter_mars.optim.levanter_config import MarsAdamWConfig
from levanter_mars.training.data.config import DataConfig, UrlDataConfig
from levanter_mars.training.errors import shared_error
from levanter_mars.training.trainer import MarsTrainerConfig


@shared_error
class ConfigError(ValueError):
    """A bad config: the message names the field or file."""


@dataclass
class TrainLmConfig(upstream_train_lm.TrainLmConfig):
    data: DataConfig = field(default_factory=UrlDataConfig)  # type: ignore[assignment]  (adds data.rebuild_cache)
    trainer: MarsTrainerConfig = field(default_factory=MarsTrainerConfig)
    model: LmConfig = field(default_factory=Gpt2Config)
    optimizer: OptimizerConfig = field(default_factory=MarsAdamWConfig)

    embedded_corpus: Optional[str] = None
    """If set, build the offline Python-docs corpus and its tokenizer in this directory before training (once)."""
    embedded_corpus_sources: str = "stdlib"
    """What the embedded corpus holds: ``stdlib`` (Python's own docs, ~0.6M tokens) or ``installed`` (also every
    installed distribution's docs, ~13M tokens: runs that must not repeat data). See ``data/pydocs_corpus.py``."""
    fresh: bool = False
    """Start over instead of resuming: the previous run directory and checkpoints are moved aside, not deleted."""
    take_over: bool = False
    """Take the run from the launch that holds its lease although that lease is live (``training/run/lease.py``): for
    a holder known dead that cannot be seen as such (another machine), instead of waiting for its lease to lapse."""
    plot: bool = True
    """Save loss_curve.png in the run directory at the end."""


def _root_cause(error: BaseException) -> BaseException:
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def config_path_argument(argv: Sequence[str]) -> Optional[str]:
    for flag in ("--config_path", "--config"):
        if flag in argv:
            index = list(argv).index(flag)
            return argv[index + 1] if index + 1 < len(argv) else None
    return None


def parse_config(argv: Sequence[str], config_class: type = TrainLmConfig):
    """Parses ``argv`` like Levanter's entry points do, turning failures into :class:`ConfigError`."""
    argv = list(argv)
    path = config_path_argument(argv)
    if path is not None and "://" not in path and not os.path.exists(path):
        raise ConfigError(f"--config_path: no such file {path!r}")

    def _identity(config):
        return config

    _identity.__annotations__ = {"config": config_class}
    try:
        with argparse_errors_raise(ConfigError), help_lists_each_option_once():
            return levanter.config.main(_identity, args=argv, config_dir=None)()
    except draccus.utils.DecodingError as e:
        where = ".".join(str(p) for p in e.key_path)
        raise ConfigError(f"{where + ': ' if where else ''}{e.message}") from e
    except draccus.utils.ParsingError as e:
        raise ConfigError(str(_root_cause(e))) from e
    except ValueError as e:
        raise ConfigError(str(e)) from e
