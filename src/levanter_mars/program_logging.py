"""What every entry point that builds a trainer (training, the standalone evaluation) sets up in ``logging`` first."""

from __future__ import annotations

import logging

PACKAGE_LOGGER = "levanter_mars"


def set_up_program_logging() -> None:
    """Levanter turns on INFO for its own loggers only; ours report resumes, skipped checkpoints and what is
    evaluated. A level set by whoever embeds us is kept."""
    package_logger = logging.getLogger(PACKAGE_LOGGER)
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO)
