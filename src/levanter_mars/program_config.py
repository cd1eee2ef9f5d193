"""The training program's config: training plus the eval suite it runs (``eval_harness: !include eval/quick.yaml``).

It lives beside ``training/`` and ``eval/``, in neither: training knows nothing of evals (the entry point injects the
eval hook), and ``infra/`` and ``bench/`` parse a training YAML without going through ``eval/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from levanter_mars.eval.suite import EvalSuiteConfig
from levanter_mars.training.config import TrainLmConfig, parse_config


@dataclass
class TrainAndEvalConfig(TrainLmConfig):
    eval_harness: Optional[EvalSuiteConfig] = None
    """An eval suite (e.g. ``!include eval/quick.yaml``), run every ``eval_harness_steps`` and at the end."""
    eval_harness_failure: str = "continue"
    """What an evaluation that fails does: 'continue' (logged, counted as eval_harness/failures, tried again at the
    next evaluation) or 'stop' the run (exit 6)."""


def parse_train_config(argv: Sequence[str]) -> TrainAndEvalConfig:
    """A training command line or YAML, eval suite included."""
    return parse_config(argv, TrainAndEvalConfig)
