"""The test session's JAX compilation cache: persistent, outside the clone, keyed by the lock.

A CI machine that runs the suite again starts with every program of the previous run compiled; a cold machine fills
the cache as it goes (training subprocesses of one session share their programs either way). The key is everything
that makes a compiled program valid: the lock (``constraints.txt``), the Python version and the machine. Caches of
other keys are removed once they have not been used for :data:`KEEP_DAYS`, so a moving lock does not fill the disk.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "levanter-mars" / "jax-compilation-cache"
KEEP_DAYS = 7
#: jax evicts least-recently-used entries past this size (JAX_COMPILATION_CACHE_MAX_SIZE, bytes).
MAX_BYTES = 4 << 30


def cache_key(lock: Path) -> str:
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(f"{sys.version_info[:2]} {platform.machine()} {platform.processor()}".encode())
    return digest.hexdigest()[:16]


def session_cache_dir(lock: Path) -> Path:
    directory = ROOT / cache_key(lock)
    directory.mkdir(parents=True, exist_ok=True)
    os.utime(directory)
    _remove_stale_siblings(directory)
    return directory


def _remove_stale_siblings(current: Path) -> None:
    cutoff = time.time() - KEEP_DAYS * 86400
    for sibling in current.parent.iterdir():
        if sibling != current and sibling.is_dir() and sibling.stat().st_mtime < cutoff:
            shutil.rmtree(sibling, ignore_errors=True)
