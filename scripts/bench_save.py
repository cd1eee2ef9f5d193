"""What a checkpoint save costs the training loop: ``docs/benchmarks/save_cost.json``.

``python scripts/bench_save.py [--output PATH] [--workdir DIR] [--quick]`` measures, on this machine's disk:

* **blocking**: a training state of GPT-2 small's size (its 124M parameters in Levanter's stacked layout, 4 copies:
  the parameters and three optimizer-state trees, as MARS-AdamW keeps; about 2 GB of float32) saved with Levanter's
  checkpoint writer (tensorstore, the asynchronous manager the trainer uses): how long the call blocks the training
  loop, and how long until the save is committed (``metadata.json`` written), against a plain write of the same
  bytes (``numpy.tofile`` per array, then ``fsync``) to the same directory. A preemption's save must commit within
  ``trainer.preemption_grace_s``; the commit time says how much of the grace a state of this size takes here.
* **memory**: host RSS after 1 and after 50 saves of a small state (the writer must not keep what it wrote).

``--quick``: a state 1/8 as wide and 5 saves (a smoke run; it writes no record unless ``--output`` is given).
``--memory-only``: the memory figures alone, replacing those of the record (with the commit and load they were
measured at); the blocking figures stay as they were.

Saves go through the trainer's workaround of defect 50 (``compat.tensorstore_writes``: jax's writer kept each save's
chunks in a 10 GB cache, +22 MB of RSS per save of the small state), as the trainer's checkpointer saves.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "docs" / "benchmarks" / "save_cost.json"
#: GPT-2 small: vocab, context, width, layers (mlp 4x width).
VOCAB, CONTEXT, WIDTH, LAYERS = 50257, 1024, 768, 12
#: The parameters and MARS-AdamW's optimizer state (first and second moments, the previous gradient).
COPIES = 4


def gpt2_small_shapes(scale: int = 1) -> dict[str, tuple[int, ...]]:
    """Levanter's GPT-2 parameter shapes (blocks stacked on a leading layers axis), the width divided by ``scale``."""
    d, layers = WIDTH // scale, LAYERS
    return {
        "wte": (VOCAB, d), "wpe": (CONTEXT, d), "ln_f.weight": (d,), "ln_f.bias": (d,),
        "c_attn.weight": (layers, d, 3 * d), "c_attn.bias": (layers, 3 * d),
        "attn.c_proj.weight": (layers, d, d), "attn.c_proj.bias": (layers, d),
        "c_fc.weight": (layers, d, 4 * d), "c_fc.bias": (layers, 4 * d),
        "mlp.c_proj.weight": (layers, 4 * d, d), "mlp.c_proj.bias": (layers, d),
        "ln_1.weight": (layers, d), "ln_1.bias": (layers, d), "ln_2.weight": (layers, d), "ln_2.bias": (layers, d),
    }  # fmt: skip


def make_state(shapes: dict[str, tuple[int, ...]], copies: int = COPIES) -> dict:
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.PRNGKey(0), copies * len(shapes)))
    # Random values: a writer that compresses gains nothing it would not on a trained state.
    return {f"copy{c}": {name: jax.random.normal(next(keys), shape, jnp.float32) for name, shape in shapes.items()}
            for c in range(copies)}  # fmt: skip


def state_bytes(state) -> int:
    import jax

    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state))


_manager = None


def levanter_save(state, path: str, step: int = 0) -> tuple[float, float]:
    """(seconds the call blocked, seconds until committed) for one save with Levanter's writer, through one manager
    for every save, as the trainer's checkpointer keeps one."""
    global _manager
    from jax.experimental.array_serialization.serialization import GlobalAsyncCheckpointManager
    from levanter.checkpoint import save_checkpoint

    from levanter_mars.compat.tensorstore_writes import writes_keep_no_chunk_cache

    if _manager is None:
        _manager = GlobalAsyncCheckpointManager(timeout_secs=3600)
    manager = _manager
    start = time.perf_counter()
    with writes_keep_no_chunk_cache():  # as the trainer's checkpointer saves
        save_checkpoint(state, step, path, manager=manager)
    blocked = time.perf_counter() - start
    manager.wait_until_finished()
    return blocked, time.perf_counter() - start


def plain_write(state, directory: Path) -> float:
    """Seconds to write the same bytes with numpy and fsync them (from host memory, as the writer's copy is)."""
    import jax
    import numpy as np

    arrays = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i, array in enumerate(arrays):
        with open(directory / f"{i}.bin", "wb") as f:
            array.tofile(f)
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - start


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def blocking(workdir: Path, scale: int) -> dict:
    state = make_state(gpt2_small_shapes(scale))
    size = state_bytes(state)
    blocked, committed = levanter_save(state, str(workdir / "levanter" / "step-0"))
    written = disk_bytes(workdir / "levanter")
    shutil.rmtree(workdir / "levanter")
    plain = plain_write(state, workdir / "plain")
    shutil.rmtree(workdir / "plain")
    return {
        "state_bytes": size, "state_gib": round(size / 2**30, 3), "levanter_bytes_on_disk": written,
        "levanter_save_blocked_s": round(blocked, 2), "levanter_save_committed_s": round(committed, 2),
        "plain_write_s": round(plain, 2), "committed_over_plain": round(committed / plain, 2),
        "blocked_over_plain": round(blocked / plain, 3),
    }  # fmt: skip


def memory(workdir: Path, saves: int) -> dict:
    state = make_state(gpt2_small_shapes(scale=32), copies=COPIES)
    rss = {}
    for step in range(1, saves + 1):
        path = workdir / "rss" / f"step-{step}"
        levanter_save(state, str(path), step)
        shutil.rmtree(path)  # the disk is not what is measured
        if step in (1, saves):
            rss[step] = rss_bytes()
    return {"small_state_bytes": state_bytes(state), "saves": saves, "rss_after_1_save_mib": round(rss[1] / 2**20, 1),
            f"rss_after_{saves}_saves_mib": round(rss[saves] / 2**20, 1),
            "rss_growth_mib": round((rss[saves] - rss[1]) / 2**20, 1),
            "rss_growth_percent": round(100 * (rss[saves] - rss[1]) / rss[1], 1)}  # fmt: skip


def memory_only(args) -> int:
    from levanter_mars import versions

    output = Path(args.output or DEFAULT_OUTPUT)
    record = json.loads(output.read_text())
    scratch = tempfile.mkdtemp(prefix="bench-save-", dir=args.workdir or REPO)
    try:
        load = round(os.getloadavg()[0], 2)
        figures = memory(Path(scratch), saves=5 if args.quick else 50)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures.update({"command": versions.command_line(), "levanter_mars": versions.source_commit(),
                    "load_average_1m_at_start": load})  # fmt: skip
    if "before_defect_50_workaround" in record.get("memory", {}):  # the figures the workaround is judged against
        figures["before_defect_50_workaround"] = record["memory"]["before_defect_50_workaround"]
    record["memory"] = figures
    text = json.dumps(record, indent=1)
    print(text)
    output.write_text(text + "\n")
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None, help=f"the record (default: {DEFAULT_OUTPUT}; --quick: none)")
    parser.add_argument("--workdir", default=None, help="where the saves go (default: a temporary directory under the "
                        "repository, on the disk checkpoints of local runs use)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a state 1/8 as wide and 5 saves")
    parser.add_argument("--memory-only", action="store_true", help="measure the memory figures alone and replace "
                        "those of the record (default: the committed one)")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from levanter_mars.bench.report import record_header

    if args.memory_only:
        return memory_only(args)

    scratch = tempfile.mkdtemp(prefix="bench-save-", dir=args.workdir or REPO)
    try:
        workdir = Path(scratch)
        record = {
            **record_header("a checkpoint save's cost to the training loop: GPT-2 small's state size (parameters + "
                            "3 optimizer-state trees, float32) saved with Levanter's writer vs a plain write of the "
                            "same bytes to the same disk; host RSS after 1 vs many saves of a small state",
                            ("jax", "jaxlib", "levanter", "tensorstore", "numpy")),
            "quick": args.quick,
            # A shared machine's other work slows the writer's compression and copies: its load, said beside.
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
            # Memory first: the large state's buffers, freed, would stay in the allocator's RSS.
            "memory": memory(workdir, saves=5 if args.quick else 50),
            "blocking": blocking(workdir, scale=8 if args.quick else 1),
        }
        record["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = json.dumps(record, indent=1)
    print(text)
    output = args.output or (None if args.quick else str(DEFAULT_OUTPUT))
    if output:
        Path(output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
