"""Defect 50: every checkpoint save leaves a copy of what it wrote in host memory, until 10 GB of them.

Levanter saves through jax's ``GlobalAsyncCheckpointManager``, whose ``async_serialize``
(``jax.experimental.array_serialization.tensorstore_impl``) opens each array's tensorstore with the module's one
``_TS_CONTEXT``: a context whose ``cache_pool`` may hold 10 GB. Tensorstore's chunk cache keeps each written chunk
(the encoded chunk of every array of every save: a new path each save, so nothing is ever reused) after its commit, as
long as the pool is under its limit. Host memory therefore grows by about the state's size per save, and a state
larger than 10 GB/saves is a process holding 10 GB more than it needs (marin issue #6774: 26 GB a save until OOM).
Measured here (``scripts/bench_save.py``, a 21 MB state): +22 MB of RSS per save.

The workaround: :func:`writes_keep_no_chunk_cache` makes ``async_serialize`` open its tensorstores with a context
whose cache pool holds nothing (``total_bytes_limit: 0``); tensorstore still buffers each write until it is
committed, and frees it then. The other resources (``file_io_concurrency``, ``data_copy_concurrency``) are jax's
own, shared. Reads (``async_deserialize``: a restore) keep jax's context. The checkpointer
(:class:`levanter_mars.training.checkpointing.writer.VerifiedCheckpointer`) saves inside it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import jax.experimental.array_serialization.tensorstore_impl as ts_impl
import tensorstore as ts

from levanter_mars.compat.patching import patched

#: jax's own context resources, but a chunk cache that keeps nothing once written.
_WRITE_CONTEXT_SPEC = {"cache_pool": {"total_bytes_limit": 0}}


@functools.lru_cache(maxsize=None)
def write_context() -> ts.Context:
    """The context saves open their tensorstores with: a child of jax's (its I/O and copy concurrency), with a cache
    pool of its own that keeps nothing."""
    return ts.Context(ts.Context.Spec(_WRITE_CONTEXT_SPEC), parent=ts_impl._TS_CONTEXT)


def jax_write_cache_limit() -> int:
    """The bytes jax's context lets tensorstore's chunk cache keep (the defect: 10 GB)."""
    return int(ts_impl._TS_CONTEXT["cache_pool"].to_json()["total_bytes_limit"])


@contextlib.contextmanager
def writes_keep_no_chunk_cache() -> Iterator[None]:
    """Within it, jax's checkpoint manager writes with :func:`write_context` (see the module docstring)."""
    original = ts_impl.async_serialize
    if getattr(original, "_keeps_no_chunk_cache", False):  # nested: already in place
        yield
        return

    def async_serialize(*args, **kwargs):
        if len(args) < 4 and "context" not in kwargs:  # context is the 4th parameter
            kwargs["context"] = write_context()
        return original(*args, **kwargs)

    async_serialize._keeps_no_chunk_cache = True  # type: ignore[attr-defined]
    with patched(ts_impl, async_serialize=async_serialize):
        yield
