"""Timing jitted steps fairly: compiled once, warmed up, blocked on, interleaved across repeats, medians.

Each :class:`Case` is a jitted ``step(state) -> state`` whose state is donated, so a chain of calls runs in place as in
training. Cases are timed one after another within a repeat, in an order rotated each repeat, so slow drift of the
machine (other processes, thermal, allocator) falls on every case alike. A case's state is built right before its
turn and dropped after it, so that only one optimizer state is alive at a time (a 355M-parameter model's states would
not all fit in memory together).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import jax

from levanter_mars.bench.hlo import traffic as hlo_traffic


@dataclasses.dataclass
class Case:
    name: str
    setup: Callable[[], Any]
    """Builds the step's input state (untimed)."""
    step: Callable[[Any], Any]
    """The jitted step. Its argument is donated; it returns the next state."""
    compiled: Optional[Any] = None
    calls: int = 1


@dataclasses.dataclass
class Timing:
    name: str
    seconds: list[float]
    """Wall seconds per call, one entry per repeat."""
    cpu_seconds: list[float]
    """CPU seconds (all threads of this process) per call, one entry per repeat. On a CPU shared with other jobs
    this counts the work done rather than the time spent waiting for a core; on an accelerator it means little."""
    calls_per_repeat: int
    compile_seconds: float
    memory: dict[str, Optional[int]]
    traffic: dict[str, Optional[float]]
    """XLA's bytes accessed and buffer copies of the compiled step (:func:`levanter_mars.bench.hlo.traffic`)."""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu_seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median over repeats: how noisy the machine was."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else math.nan


def memory_analysis(compiled: Any) -> dict[str, Optional[int]]:
    """XLA's own accounting of a compiled executable (no run needed): arguments, outputs, scratch, and the peak it
    implies, ``arguments + outputs - aliased (donated) + temporaries``. None where the backend does not say."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        stats = None
    if stats is None:
        return {"argument_bytes": None, "output_bytes": None, "alias_bytes": None, "temp_bytes": None, "peak_bytes": None}
    arguments = int(stats.argument_size_in_bytes)
    outputs = int(stats.output_size_in_bytes)
    aliased = int(stats.alias_size_in_bytes)
    temporaries = int(stats.temp_size_in_bytes)
    return {
        "argument_bytes": arguments,
        "output_bytes": outputs,
        "alias_bytes": aliased,
        "temp_bytes": temporaries,
        "peak_bytes": arguments + outputs - aliased + temporaries,
    }


def device_peak_bytes() -> Optional[int]:
    """The device allocator's peak so far in this process (GPU/TPU), or None (CPU has no allocator statistics)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return None if not stats else stats.get("peak_bytes_in_use")


def _run(compiled: Any, state: Any, calls: int) -> tuple[Any, float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        state = compiled(state)
    jax.block_until_ready(state)
    return state, time.perf_counter() - start, time.process_time() - start_cpu


def time_interleaved(
    cases: Sequence[Case],
    *,
    repeats: int,
    min_seconds_per_repeat: float = 0.2,
    max_calls: int = 50,
    progress: Callable[[str], None] = lambda message: None,
) -> list[Timing]:
    """Times every case ``repeats`` times, interleaved; returns seconds per call for each repeat.

    The first turn of each case compiles it (timed separately), runs one warm-up call, and picks how many calls one
    repeat makes (enough for ``min_seconds_per_repeat``, at most ``max_calls``). Every later turn also runs one
    untimed warm-up call before its timed calls.
    """
    compile_seconds: dict[str, float] = {}
    memory: dict[str, dict[str, Optional[int]]] = {}
    traffic: dict[str, dict[str, Optional[float]]] = {}
    seconds: dict[str, list[float]] = {c.name: [] for c in cases}
    cpu_seconds: dict[str, list[float]] = {c.name: [] for c in cases}
    for repeat in range(repeats):
        shift = repeat % len(cases)
        for case in list(cases[shift:]) + list(cases[:shift]):
            state = case.setup()
            if case.compiled is None:
                start = time.perf_counter()
                case.compiled = jax.jit(case.step, donate_argnums=0).lower(state).compile()
                compile_seconds[case.name] = time.perf_counter() - start
                memory[case.name] = memory_analysis(case.compiled)
                traffic[case.name] = hlo_traffic(case.compiled)
                state, warm, _ = _run(case.compiled, state, 1)
                case.calls = max(1, min(max_calls, math.ceil(min_seconds_per_repeat / max(warm, 1e-9))))
            else:
                state, _, _ = _run(case.compiled, state, 1)
            state, elapsed, cpu = _run(case.compiled, state, case.calls)
            seconds[case.name].append(elapsed / case.calls)
            cpu_seconds[case.name].append(cpu / case.calls)
            del state
            gc.collect()
            progress(f"repeat {repeat + 1}/{repeats} {case.name}: {1e3 * elapsed / case.calls:.2f} ms/call")
    return [
        Timing(
            c.name, seconds[c.name], cpu_seconds[c.name], c.calls, compile_seconds[c.name], memory[c.name],
            traffic[c.name],
        )
        for c in cases
    ]
