"""jax's compilation, as the goodput record and the compilation cache watch it (defect 37).

* :data:`COMPILE_EVENTS`: the ``jax.monitoring`` events jax records, with their durations, for the three stages of a
  compilation (tracing, lowering to MLIR, the backend's compile or a load from the persistent cache). jax names them
  only in a private module (``jax._src.dispatch``).
* :func:`log_cache_use_once_per_program`: jax logs a persistent-cache hit or miss at DEBUG only (at WARNING with
  ``jax_log_compiles`` / ``jax_explain_cache_misses``, which also log every compilation and every tracing-cache miss):
  turned into one INFO line per program that is worth caching (a hit, or a miss that is then stored: it compiled for
  at least ``jax_persistent_cache_min_compile_time_secs``), and counted. jax says so only in DEBUG records.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

logger = logging.getLogger("levanter_mars.compilation_cache")

_COMPILER_LOGGER = "jax._src.compiler"
_HIT = "Persistent compilation cache hit for"
_MISS = "PERSISTENT COMPILATION CACHE MISS for"
_STORED = "'%s' took at least %.2f seconds to compile (%.2fs)"  # then written to the cache (process 0)
_NOT_PROCESS_ZERO = "Not writing persistent cache entry since process_id != 0"


def compile_events() -> tuple[str, ...]:
    """The duration events of a compilation's stages: tracing, lowering, backend compile (or cache load)."""
    from jax._src import dispatch

    return (dispatch.JAXPR_TRACE_EVENT, dispatch.JAXPR_TO_MLIR_MODULE_EVENT, dispatch.BACKEND_COMPILE_EVENT)


class _CacheUse(logging.Filter):
    """Counts jax's hit/miss records (and logs each program's first at INFO); every record keeps the fate it had at
    the logger's own level."""

    def __init__(self, threshold: int):
        super().__init__()
        self.threshold = threshold
        self.counts: Counter = Counter()
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith(_HIT) and record.args:
            self._count("hit", str(record.args[0]), "Compilation cache hit: %s", str(record.args[0]))
        elif message.startswith(_MISS) and record.args:
            with self._lock:
                self.counts["miss"] += 1
        elif message == _STORED and record.args:
            program, seconds = str(record.args[0]), float(record.args[2])
            self._count("stored", program, "Compilation cache miss: %s compiled in %.1f s, now stored",
                        program, seconds)  # fmt: skip
        elif message == _NOT_PROCESS_ZERO:
            with self._lock:
                self.counts["not stored here"] += 1
        return record.levelno >= self.threshold

    def _count(self, kind: str, program: str, *message) -> None:
        with self._lock:
            self.counts[kind] += 1
            first = (kind, program) not in self._seen
            self._seen.add((kind, program))
        if first:
            logger.info(*message)


_installed: _CacheUse | None = None


def log_cache_use_once_per_program() -> None:
    global _installed
    if _installed is not None:
        return
    compiler_logger = logging.getLogger(_COMPILER_LOGGER)
    _installed = _CacheUse(compiler_logger.getEffectiveLevel())
    compiler_logger.addFilter(_installed)
    compiler_logger.setLevel(logging.DEBUG)


def cache_use() -> dict[str, int]:
    """Persistent-cache hits, misses and misses then stored, in this process so far (zeros before
    :func:`log_cache_use_once_per_program`)."""
    counts = _installed.counts if _installed is not None else Counter()
    return {"hits": counts["hit"], "misses": counts["miss"], "stored": counts["stored"]}
