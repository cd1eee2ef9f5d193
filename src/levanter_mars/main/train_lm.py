"""``python -m levanter_mars.main.train_lm --config_path config/<file>.yaml [--section.field value ...]``"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from levanter_mars.training.checkpoints import CheckpointError
from levanter_mars.training.config import ConfigError, parse_config
from levanter_mars.training.run import train
from levanter_mars.training.trainer import DataExhaustedError, NonFiniteTrainingError


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        summary = train(parse_config(argv))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, NonFiniteTrainingError, DataExhaustedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


if __name__ == "__main__":
    sys.exit(cli())
