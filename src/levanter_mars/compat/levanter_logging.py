"""Defect 28: Levanter's log file is ``<log_dir>/<run id>.log.log``."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from levanter_mars.compat.patching import patched


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
