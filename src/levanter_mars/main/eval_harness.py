"""``python -m levanter_mars.main.eval_harness --config_path config/eval/<suite>.yaml [--checkpoint_path DIR]
[--train_config_path config/<run>.yaml] [--field value ...]``

Evaluates a checkpoint on an eval suite and writes results.json and results.md (see docs/evals.md).
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

import levanter_mars.optim.levanter_config  # noqa: F401  (registers the mars-* optimizer types)
from levanter_mars.eval.standalone import EvalHarnessMainConfig, evaluate
from levanter_mars.eval.suite import EvalDatasetError, TaskSpecError
from levanter_mars.training.errors import CheckpointError
from levanter_mars.training.config import ConfigError, config_path_argument, parse_config


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    suite_path = config_path_argument(argv)
    suite = os.path.splitext(os.path.basename(suite_path))[0] if suite_path else "suite"
    try:
        result = evaluate(parse_config(argv, EvalHarnessMainConfig), suite=suite)
    except (ConfigError, TaskSpecError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, EvalDatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if result is not None:
        print(result.written.table, end="")
        print(f"results: {result.written.json_path}\ntable:   {result.written.table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
