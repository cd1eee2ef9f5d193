"""Levanter's logging: its log file is ``<log_dir>/<run id>.log.log`` (defect 28), and every restore of a state warns
once per None leaf (defect 43)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

from levanter_mars.compat.patching import patched

#: Where Levanter's tensorstore (de)serialization logs, and what it logs for each None leaf of a state it restores (a
#: field the model or the optimizer does not use, which it then skips, as it should), levanter 1.2.dev1644.
SERIALIZATION_LOGGER = "levanter.tensorstore_serialization"
NONE_LEAF_WARNING = "Unknown leaf type <class 'NoneType'>"


@contextlib.contextmanager
def log_file_named_by_run_id(name: Optional[str] = None) -> Iterator[None]:
    """While Levanter initializes: ``TrainerConfig.initialize`` passes ``f"{id}.log"`` to ``init_logging``, which
    appends ``.log`` again. The log is ``<log_dir>/<run id>.log``, as documented, and ``fresh`` sets it aside there;
    with ``name``, ``<log_dir>/<name>.log`` (a program that is not the run's training, such as its evaluation, must
    not append to the run's log)."""
    import levanter.utils.logging as levanter_logging

    init_logging = levanter_logging.init_logging

    def init_logging_once_suffixed(log_dir, run_id, *args, **kwargs):
        return init_logging(log_dir, name or run_id.removesuffix(".log"), *args, **kwargs)

    with patched(levanter_logging, init_logging=init_logging_once_suffixed):
        yield


class NoneLeafWarningsDropped(logging.Filter):
    """Drops exactly :data:`NONE_LEAF_WARNING`: another unknown leaf type still warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != NONE_LEAF_WARNING


def none_leaf_warnings_dropped() -> None:
    """Defect 43: a resume printed 16 ``Unknown leaf type <class 'NoneType'>`` warnings, which say nothing wrong. For
    the rest of the process (a filter on Levanter's serialization logger, which outlives ``init_logging``'s handler
    setup); calling it again adds nothing."""
    serialization_logger = logging.getLogger(SERIALIZATION_LOGGER)
    if not any(isinstance(f, NoneLeafWarningsDropped) for f in serialization_logger.filters):
        serialization_logger.addFilter(NoneLeafWarningsDropped())
