"""Defect 50 (``levanter_mars.compat.tensorstore_writes``): jax's checkpoint writer opens every array's tensorstore in
one context whose 10 GB chunk cache keeps what each save wrote: host memory grows by the state's size per save."""

import ctypes
import gc
import inspect
import shutil

import jax
import jax.experimental.array_serialization.tensorstore_impl as ts_impl
import jax.numpy as jnp
import psutil
import pytest
from jax.experimental.array_serialization.serialization import GlobalAsyncCheckpointManager
from levanter.checkpoint import save_checkpoint

from levanter_mars.compat.tensorstore_writes import jax_write_cache_limit, write_context, writes_keep_no_chunk_cache
from levanter_mars.training.checkpointing import writer

MIB = 2**20


def _state() -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), 4)  # random: nothing for the writer's compression to shrink
    return {f"w{i}": jax.random.normal(key, (512, 1024), jnp.float32) for i, key in enumerate(keys)}  # 8 MiB


def _rss_after_saves(tmp_path, state, saves: int) -> list[float]:
    """Host RSS (MiB) after each save (committed, then deleted: the disk is not what is measured)."""
    manager = GlobalAsyncCheckpointManager(timeout_secs=300)
    rss = []
    for step in range(saves):
        path = tmp_path / f"step-{step}"
        save_checkpoint(state, step, str(path), manager=manager)
        manager.wait_until_finished()
        shutil.rmtree(path)
        gc.collect()
        ctypes.CDLL(None).malloc_trim(0)  # what the allocator keeps of freed memory is not the defect
        rss.append(psutil.Process().memory_info().rss / MIB)
    return rss


@pytest.mark.slow  # 24 saves of 8 MiB
def test_defect_50_each_save_stays_in_jax_writers_chunk_cache_and_the_workaround_keeps_none(tmp_path):
    state = _state()
    state_mib = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state)) / MIB
    saves, warm_up = 12, 2
    # The workaround first: the defect's cache stays in jax's context for the rest of the process.
    with writes_keep_no_chunk_cache():
        fixed = _rss_after_saves(tmp_path / "fixed", state, saves)
    raw = _rss_after_saves(tmp_path / "raw", state, saves)
    fixed_growth, raw_growth = fixed[-1] - fixed[warm_up - 1], raw[-1] - raw[warm_up - 1]
    later = saves - warm_up
    assert jax_write_cache_limit() == 10_000_000_000
    # The defect (fails once jax writes without keeping its chunks): about the state's size per save.
    assert raw_growth > 0.6 * state_mib * later, (raw, state_mib)
    assert fixed_growth < 0.2 * state_mib * later, (fixed, state_mib)


def test_the_workaround_writes_in_a_context_keeping_nothing_and_restores_jax_writer():
    assert list(inspect.signature(ts_impl.async_serialize).parameters)[3] == "context"  # where the wrapper puts it
    assert write_context()["cache_pool"].to_json().get("total_bytes_limit", 0) == 0
    original = ts_impl.async_serialize
    with writes_keep_no_chunk_cache():
        patched = ts_impl.async_serialize
        assert patched is not original
        with writes_keep_no_chunk_cache():
            assert ts_impl.async_serialize is patched
    assert ts_impl.async_serialize is original


def test_the_checkpointer_saves_within_the_workaround():
    source = inspect.getsource(writer.VerifiedCheckpointer.save_checkpoint)
    assert "with writes_keep_no_chunk_cache():" in source
