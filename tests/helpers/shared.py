"""Session fixtures made once per test run, however many pytest-xdist workers share it.

``make test`` runs two workers (tests/conftest.py); a session fixture such as ``reference_runs`` would otherwise be
made by each, two identical training runs compiling the same programs at once. :func:`once_per_run` lets the first
worker make it, in a directory every worker sees, while the others wait on a file lock and then read what it left.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock


def run_directory(tmp_path_factory) -> Path:
    """The directory of this test run that every worker shares (a worker's own base temp is inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], Any], record: Callable[[Any], Any],
                 restore: Callable[[Any, Path], Any]) -> Any:
    """``make(directory)`` in the first worker to ask; every other worker gets ``restore(record(result), directory)``
    (the maker gets ``result`` itself). A failed ``make`` fails every worker that asks, with the maker's traceback."""
    root = run_directory(tmp_path_factory)
    directory, done, failed = root / name, root / f"{name}.json", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if done.exists():
            return restore(json.loads(done.read_text()), directory)
        if failed.exists():
            raise RuntimeError(f"session fixture {name!r} failed in another worker:\n{failed.read_text()}")
        directory.mkdir()
        try:
            result = make(directory)
        except BaseException:
            failed.write_text(traceback.format_exc())
            raise
        done.write_text(json.dumps(record(result)))
        return result
