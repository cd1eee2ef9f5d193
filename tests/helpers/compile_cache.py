"""The test session's JAX compilation cache: persistent, outside the clone, keyed by the lock.

A CI machine that runs the suite again starts with every program of the previous run compiled; a cold machine fills
the cache as it goes (training subprocesses of one session share their programs either way). The key is everything
that makes a compiled program valid: the lock (``constraints.txt``), the Python version and the CPU's instruction set
(:func:`machine_key`: XLA:CPU compiles for the host's features, and a program built for one CPU may not run on
another). Caches of
other keys are removed once they have not been used for :data:`KEEP_DAYS`, so a moving lock does not fill the disk.

The size is bounded here, once per session (:func:`trim`), not by jax's own eviction
(``JAX_COMPILATION_CACHE_MAX_SIZE``): with a maximum size set, jax scans the whole directory under one file lock on
every store, and every lookup waits on that lock. The suite stores about 3,750 programs (every compile is kept:
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``); at that size one scan took 0.26 CPU-s, about 500 CPU-s over a
cold session, and a warm cache made every later store pay it (ci8's `.ci/newest` took 303 s against 141 s).
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
#: At a session's start, the oldest entries go until the cache is under this size (bytes).
MAX_BYTES = 4 << 30


def machine_key(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's features, as /proc/cpuinfo lists them (``flags`` on x86, ``Features`` on ARM; every distinct line, for
    cores that differ), hashed; else the architecture's name. Not ``platform.processor()``, empty on Linux: a cache
    moved to another CPU of the same architecture was reused."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    features = sorted({line.split(":", 1)[1].strip() for line in lines
                       if ":" in line and line.split(":", 1)[0].strip() in ("flags", "Features")})
    if not features:
        return f"machine {platform.machine()}"
    return f"{platform.machine()} cpu flags " + hashlib.sha256("\n".join(features).encode()).hexdigest()[:16]


def cache_key(lock: Path, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(f"{sys.version_info[:2]} {machine_key(cpuinfo)}".encode())
    return digest.hexdigest()[:16]


def session_cache_dir(lock: Path) -> Path:
    directory = ROOT / cache_key(lock)
    directory.mkdir(parents=True, exist_ok=True)
    os.utime(directory)
    _remove_stale_siblings(directory)
    trim(directory, MAX_BYTES)
    return directory


def trim(directory: Path, max_bytes: int) -> None:
    """Removes the least recently written files until ``directory`` holds at most ``max_bytes``."""
    files = []
    for entry in directory.iterdir():
        try:
            stat = entry.stat()
        except FileNotFoundError:  # removed meanwhile by another session's trim
            continue
        files.append((stat.st_mtime, stat.st_size, entry))
    files.sort()
    total = sum(size for _, size, _ in files)
    for _, size, entry in files:
        if total <= max_bytes:
            break
        entry.unlink(missing_ok=True)
        total -= size


def _remove_stale_siblings(current: Path) -> None:
    cutoff = time.time() - KEEP_DAYS * 86400
    for sibling in current.parent.iterdir():
        if sibling != current and sibling.is_dir() and sibling.stat().st_mtime < cutoff:
            shutil.rmtree(sibling, ignore_errors=True)
