"""Timing optimizers side by side on one parameter tree: the common core of the update and train-step benchmarks."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from levanter_mars.bench.models import buffer_bytes, parameter_count
from levanter_mars.bench.optimizers import OptimizerCase, make_step
from levanter_mars.bench.report import log
from levanter_mars.bench.timing import Case, time_interleaved

COLUMNS = (
    ("optimizer", "optimizer"),
    ("median_ms", "ms/step"),
    ("ratio_to_adamw", "x AdamW"),
    ("spread", "spread"),
    ("state_bytes_per_param", "state B/param"),
    ("peak_mib", "peak MiB"),
    ("temp_mib", "temp MiB"),
    ("compile_s", "compile s"),
)


def _copy(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)


def paired_ratio(row: dict, baseline: dict) -> float:
    """Median over repeats of ``row / baseline`` for the same repeat (the two ran back to back)."""
    return statistics.median(a / b for a, b in zip(row["ms_per_repeat"], baseline["ms_per_repeat"]))


def compare(
    cases: Sequence[OptimizerCase],
    params: Any,
    data: Any,
    gradient_and_objective: Callable[[Any, Any], tuple[Any, Any]],
    *,
    repeats: int,
    baseline: Optional[str] = "adamw",
) -> list[dict]:
    """One row per optimizer: the jitted step's time (median, per repeat, as a ratio to ``baseline``), its state's
    bytes per parameter and XLA's memory figures. ``data`` is the step's input besides params and state."""
    count = parameter_count(params)
    timed, state_bytes = [], {}
    for case in cases:
        optimizer, step = make_step(case, gradient_and_objective)
        init = jax.jit(optimizer.init)
        state_bytes[case.name] = buffer_bytes(jax.eval_shape(init, params))

        def setup(init=init):
            return _copy(params), init(params), _copy(data)

        timed.append(Case(case.name, setup, step))
    timings = time_interleaved(timed, repeats=repeats, progress=log)

    rows = []
    for case, t in zip(cases, timings):
        mib = {k.replace("_bytes", "_mib"): None if v is None else v / 2**20 for k, v in t.memory.items()}
        rows.append(
            {
                "optimizer": case.name,
                "description": case.description,
                "median_ms": 1e3 * t.median,
                "ms_per_repeat": [1e3 * s for s in t.seconds],
                "spread": t.spread,
                "calls_per_repeat": t.calls_per_repeat,
                "compile_s": t.compile_seconds,
                "state_bytes": state_bytes[case.name],
                "state_bytes_per_param": state_bytes[case.name] / count,
                **t.memory,
                "peak_mib": mib["peak_mib"],
                "temp_mib": mib["temp_mib"],
            }
        )
    base = next((r for r in rows if r["optimizer"] == baseline), None)
    for row in rows:
        row["ratio_to_adamw"] = None if base is None else paired_ratio(row, base)
    return rows
