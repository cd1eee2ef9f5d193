"""``python -m levanter_mars.main.eval_harness --config_path config/eval/<suite>.yaml [--checkpoint_path DIR]
[--train_config_path config/<run>.yaml] [--field value ...]``

Evaluates a checkpoint on an eval suite and writes results.json and results.md (see docs/evals.md). Exit codes as the
training program's (training/errors.py, docs/evals.md "Exit codes"): 2 a bad config (a checkpoint_path that holds no
checkpoint included), 5 checkpoints that cannot be used, 6 task data that cannot be loaded, 1 a crash.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

import levanter_mars.optim.levanter_config  # noqa: F401  (registers the mars-* optimizer types)
from levanter_mars.eval.standalone import EvalHarnessMainConfig, evaluate
from levanter_mars.eval.suite import EvalDatasetError, TaskSpecError
from levanter_mars.training.errors import CheckpointError, ExitCode
from levanter_mars.training.config import ConfigError, config_path_argument, parse_config


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    suite_path = config_path_argument(argv)
    suite = os.path.splitext(os.path.basename(suite_path))[0] if suite_path else "suite"
    try:
        result = evaluate(parse_config(argv, EvalHarnessMainConfig), suite=suite)
    except (ConfigError, TaskSpecError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    except (CheckpointError, EvalDatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT_STORAGE if isinstance(e, CheckpointError) else ExitCode.EVAL_FAILED
    if result is not None:
        print(result.written.table, end="")
        print(f"results: {result.written.json_path}\ntable:   {result.written.table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
