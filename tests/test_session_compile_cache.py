"""The test session's persistent compilation cache (tests/helpers/compile_cache.py): bounded once per session, with
jax's per-store eviction off (it scans the whole cache under one lock on every store)."""

import os

import jax

from tests.helpers import compile_cache


def test_trim_removes_the_least_recently_written_entries_until_the_cache_fits(tmp_path):
    for age, name in enumerate(["newest", "middle", "oldest"]):
        entry = tmp_path / f"{name}-cache"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1_000_000 - age, 1_000_000 - age))
    compile_cache.trim(tmp_path, 250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle-cache", "newest-cache"]
    compile_cache.trim(tmp_path, 200)
    assert len(list(tmp_path.iterdir())) == 2, "a cache that fits is left alone"


def test_the_session_cache_leaves_jax_eviction_off():
    assert os.environ["JAX_COMPILATION_CACHE_DIR"], "the session has a persistent cache"
    assert "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ, "set, jax scans the whole cache on every store"
    assert jax.config.jax_compilation_cache_max_size == -1
