"""What every entry point that builds a trainer (training, the standalone evaluation) sets up in ``logging`` first."""

from __future__ import annotations

import logging

from levanter_mars.compat.levanter_logging import none_leaf_warnings_dropped

PACKAGE_LOGGER = "levanter_mars"


def set_up_program_logging() -> None:
    """Levanter turns on INFO for its own loggers only; ours report resumes, skipped checkpoints and what is
    evaluated (a level set by whoever embeds us is kept). Levanter's warnings of nothing wrong are dropped."""
    package_logger = logging.getLogger(PACKAGE_LOGGER)
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO)
    none_leaf_warnings_dropped()
