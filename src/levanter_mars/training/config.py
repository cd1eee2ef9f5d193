"""The training config: Levanter's ``TrainLmConfig`` with our trainer, MARS by default, and a few run-level fields.

Parsing goes through Levanter's ``levanter.config.main`` (YAML via ``--config_path``, gs:// URLs, ``--configs a b``,
and ``--section.field value`` overrides); errors come back as a :class:`ConfigError` that names the field.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import draccus
import levanter.config
from levanter.main.train_lm import TrainLmConfig as UpstreamTrainLmConfig
from levanter.models.gpt2 import Gpt2Config
from levanter.models.lm_model import LmConfig
from levanter.optim import OptimizerConfig

import levanter_mars.optim.levanter_config  # noqa: F401  (registers mars-adamw, mars-lion, mars-shampoo)
from levanter_mars.eval.suite import EvalSuiteConfig
from levanter_mars.optim.levanter_config import MarsAdamWConfig
from levanter_mars.training.trainer import MarsTrainerConfig


class ConfigError(ValueError):
    """A bad config: the message names the field or file."""


@dataclass
class TrainLmConfig(UpstreamTrainLmConfig):
    trainer: MarsTrainerConfig = field(default_factory=MarsTrainerConfig)
    model: LmConfig = field(default_factory=Gpt2Config)
    optimizer: OptimizerConfig = field(default_factory=MarsAdamWConfig)
    eval_harness: Optional[EvalSuiteConfig] = None
    """An eval suite (e.g. ``!include eval/quick.yaml``), run every ``eval_harness_steps`` and at the end."""

    embedded_corpus: Optional[str] = None
    """If set, build the offline Python-docs corpus and its tokenizer in this directory before training (once)."""
    fresh: bool = False
    """Start over instead of resuming: the previous run directory and checkpoints are moved aside, not deleted."""
    plot: bool = True
    """Save loss_curve.png in the run directory at the end."""


def _root_cause(error: BaseException) -> BaseException:
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def _config_path_argument(argv: Sequence[str]) -> Optional[str]:
    for flag in ("--config_path", "--config"):
        if flag in argv:
            index = list(argv).index(flag)
            return argv[index + 1] if index + 1 < len(argv) else None
    return None


def parse_config(argv: Sequence[str], config_class: type = TrainLmConfig):
    """Parses ``argv`` like Levanter's entry points do, turning failures into :class:`ConfigError`."""
    argv = list(argv)
    path = _config_path_argument(argv)
    if path is not None and "://" not in path and not os.path.exists(path):
        raise ConfigError(f"--config_path: no such file {path!r}")

    def _identity(config):
        return config

    _identity.__annotations__ = {"config": config_class}
    try:
        with _argparse_errors_as_config_errors():
            return levanter.config.main(_identity, args=argv, config_dir=None)()
    except draccus.utils.DecodingError as e:
        where = ".".join(str(p) for p in e.key_path)
        raise ConfigError(f"{where + ': ' if where else ''}{e.message}") from e
    except draccus.utils.ParsingError as e:
        raise ConfigError(str(_root_cause(e))) from e
    except ValueError as e:
        raise ConfigError(str(e)) from e


@contextlib.contextmanager
def _argparse_errors_as_config_errors() -> Iterator[None]:
    """argparse's ``error`` prints the whole usage (some 240 lines of fields) before the one line that matters; raise
    instead, with the closest known flag for each unrecognized one."""
    original = argparse.ArgumentParser.error

    def error(parser: argparse.ArgumentParser, message: str):
        known = [flag for action in parser._actions for flag in action.option_strings]
        hints = []
        for token in message.split():
            if token.startswith("--") and token not in known:
                close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.75)
                if close:
                    hints.append(f"{token}: did you mean {close[0]}?")
        raise ConfigError("; ".join([message, *hints]) + f" (`{parser.prog} --help` lists every field)")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]
