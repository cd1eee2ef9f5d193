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


def _cpuinfo(tmp_path, name, *lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_cache_is_keyed_on_the_cpus_flags_not_only_its_architecture(tmp_path):
    """XLA:CPU compiles for the host's instruction set: a cache moved to a CPU with other flags is not reused, one on a
    CPU with the same flags (another clock speed, another core count) is."""
    lock = tmp_path / "constraints.txt"
    lock.write_text("jax==0.10.2\n")
    avx512 = _cpuinfo(tmp_path, "a", "processor\t: 0", "cpu MHz\t\t: 2000.0", "flags\t\t: fpu sse2 avx2 avx512f")
    avx2 = _cpuinfo(tmp_path, "b", "processor\t: 0", "cpu MHz\t\t: 2000.0", "flags\t\t: fpu sse2 avx2")
    cores = [f"processor\t: {i}\ncpu MHz\t\t: 3100.5\nflags\t\t: fpu sse2 avx2" for i in range(4)]
    same = _cpuinfo(tmp_path, "c", *cores)
    assert compile_cache.cache_key(lock, avx512) != compile_cache.cache_key(lock, avx2)
    assert compile_cache.cache_key(lock, avx2) == compile_cache.cache_key(lock, same)


def test_without_cpu_flags_the_key_names_the_architecture(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_cache.platform, "machine", lambda: "riscv64")
    assert compile_cache.machine_key(_cpuinfo(tmp_path, "none", "processor\t: 0")) == "machine riscv64"
    assert compile_cache.machine_key(tmp_path / "absent") == "machine riscv64"
    arm = _cpuinfo(tmp_path, "arm", "processor\t: 0", "Features\t: fp asimd evtstrm aes")
    assert compile_cache.machine_key(arm).startswith("riscv64 cpu flags ")
