"""A compilation cache per run, on the run's storage: a retry, a resume, and a resume on another slice of the same
shape load their compiled programs instead of compiling them again.

Where it lives (``trainer.compilation_cache``), first that applies:

1. ``trainer.compilation_cache`` in the config: a local directory or a URL (``gs://...``), or ``none`` (no cache);
2. ``$JAX_COMPILATION_CACHE_DIR``, if set: a cache someone chose for every JAX program of the machine or the job
   (jax's own setting; the test suite sets one for all of its processes);
3. the default, beside the run's checkpoints: ``<trainer.checkpointer.base_path>/compile-cache``, so that a pod's
   retries (on fresh VMs) find it in the bucket where they find the checkpoints.

Every host sets it before the run's programs compile (before it, only a pod's start-up barrier compiles: on XLA:CPU
pods the cache is already off then, :func:`loads_can_deadlock`);
JAX itself reads and writes it, and only process 0 writes (``jax._src.compiler._cache_write``). Programs that compile
in less than ``jax_persistent_cache_min_compile_time_secs`` (1 s unless ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``
says otherwise) are not stored: reading one back would cost about as much. Each program's hit or miss is logged once;
the goodput record counts them per attempt.
"""

from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import dataclass
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

#: ``trainer.compilation_cache: none`` turns the cache off.
OFF = "none"
#: The default cache's directory under ``trainer.checkpointer.base_path``.
DEFAULT_DIRECTORY = "compile-cache"
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


@dataclass(frozen=True)
class CacheChoice:
    path: Optional[str]
    """Where compiled programs go; None: no cache."""
    source: str
    """What chose it, as a user would set it (the field, the variable, or the default)."""


def resolve(trainer_config, environ: Mapping[str, str] = os.environ) -> CacheChoice:
    """The run's cache: the config's field, else ``$JAX_COMPILATION_CACHE_DIR``, else beside the checkpoints."""
    field = "trainer.compilation_cache"
    explicit = getattr(trainer_config, "compilation_cache", None)
    if explicit is not None and str(explicit).strip():
        if str(explicit).strip().lower() == OFF:
            return CacheChoice(None, field)
        return CacheChoice(_absolute(str(explicit)), field)
    if environ.get(JAX_CACHE_ENV):
        return CacheChoice(_absolute(environ[JAX_CACHE_ENV]), f"${JAX_CACHE_ENV}")
    base = str(trainer_config.checkpointer.base_path)
    return CacheChoice(_absolute(posixpath.join(base, DEFAULT_DIRECTORY)),
                       f"{field} (default: beside the checkpoints, under trainer.checkpointer.base_path)")


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def loads_can_deadlock() -> bool:
    """True on a pod of XLA:CPU hosts (gloo collectives). There, a program loaded from the persistent cache (by every
    host, or by some while others compiled it) has left one host's devices in different collectives at once, each
    waiting for the others: 6 of 12 simulated 2-host pods hung in their loss evaluation, none of 16 that compiled
    every program (scripts/cpu_pod_eval_hang.py, docs/benchmarks/cpu_pod_eval_hang_*.json, jax 0.10.2). Never seen on
    TPU, where the cache stays on."""
    import jax

    from levanter_mars.training import distributed

    return distributed.is_multiprocess() and jax.default_backend() == "cpu"


def turn_off() -> None:
    """No program is read from or written to JAX's persistent cache from now on."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once whether to use its cache: an earlier program may have asked


def enable(trainer_config) -> CacheChoice:
    """Points JAX at the run's cache (every host, before the run's programs compile) and reports each program's hit
    or miss once."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    from levanter_mars.compat import jax_compilation

    choice = resolve(trainer_config)
    if choice.path is not None and loads_can_deadlock():
        logger.warning("Compilation cache: off on this XLA:CPU pod (%s would be %s): programs loaded from it have "
                       "deadlocked simulated pods in their collectives (docs/reliability.md, known limits)",
                       choice.source, choice.path)
        choice = CacheChoice(None, f"{choice.source}, turned off: an XLA:CPU pod")
    if choice.path is None:
        turn_off()
        logger.info("Compilation cache: off (%s: %s)", choice.source, OFF)
        return choice
    jax_compilation.log_cache_use_once_per_program()
    jax.config.update("jax_enable_compilation_cache", True)
    if jax.config.jax_compilation_cache_dir != choice.path:
        jax.config.update("jax_compilation_cache_dir", choice.path)
        compilation_cache.reset_cache()  # JAX settles its cache once, at the first compilation: settle it again
    logger.info("Compilation cache: %s (%s)", choice.path, choice.source)
    return choice
