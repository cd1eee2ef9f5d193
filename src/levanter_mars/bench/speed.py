"""Timing optimizers side by side on one parameter tree: the common core of the update and train-step benchmarks."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from levanter_mars.bench.hlo import traffic as hlo_traffic
from levanter_mars.bench.models import buffer_bytes, parameter_count
from levanter_mars.bench.optimizers import OptimizerCase, make_step
from levanter_mars.bench.report import log
from levanter_mars.bench.timing import Case, time_interleaved

COLUMNS = (
    ("optimizer", "optimizer"),
    ("median_ms", "ms/step"),
    ("ratio_to_adamw", "x AdamW"),
    ("spread", "spread"),
    ("median_cpu_ms", "CPU ms"),
    ("cpu_ratio_to_adamw", "CPU x AdamW"),
    ("state_bytes_per_param", "state B/param"),
    ("peak_mib", "peak MiB"),
    ("temp_mib", "temp MiB"),
    ("hlo_passes", "HLO passes"),
    ("copy_mib", "copy MiB"),
    ("compile_s", "compile s"),
)


def ratio_basis(platform: str) -> str:
    """What the goals are judged on: CPU time on a CPU (this project's 2 cores are shared with other jobs, whose
    load wall time would measure), wall time on an accelerator."""
    return "cpu" if platform == "cpu" else "wall"


def ratio_key(basis: str) -> str:
    return "cpu_ratio_to_adamw" if basis == "cpu" else "ratio_to_adamw"


def _copy(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)


def paired_ratio(row: dict, baseline: dict, key: str = "ms_per_repeat") -> float:
    """Median over repeats of ``row / baseline`` for the same repeat (the two ran close together)."""
    return statistics.median(a / b for a, b in zip(row[key], baseline[key]))


def ratios(row: dict, baseline: Optional[dict]) -> dict[str, Optional[float]]:
    """Wall-time and CPU-time ratios of ``row`` to ``baseline``."""
    if baseline is None:
        return {"wall": None, "cpu": None}
    return {"wall": paired_ratio(row, baseline), "cpu": paired_ratio(row, baseline, "cpu_ms_per_repeat")}


def compare(
    cases: Sequence[OptimizerCase],
    params: Any,
    data: Any,
    gradient_and_objective: Callable[[Any, Any], tuple[Any, Any]],
    *,
    repeats: int,
    baseline: Optional[str] = "adamw",
    unguarded_traffic: bool = False,
) -> list[dict]:
    """One row per optimizer: the jitted step's time (median, per repeat, as a ratio to ``baseline``), its state's
    bytes per parameter, XLA's memory figures and its memory traffic from the HLO (bytes accessed in float32
    parameter-sized passes, and buffer copies). ``data`` is the step's input besides params and state.

    The optimizer runs inside the non-finite guard every trainer wraps it in (what training runs); with
    ``unguarded_traffic``, the traffic of the same step without the guard is compiled too (``hlo_passes_unguarded``,
    and ``guard_hlo_passes`` the difference: the guard's own cost), not timed."""
    count = parameter_count(params)
    timed, state_bytes = [], {}
    for case in cases:
        optimizer, step = make_step(case, gradient_and_objective, guarded=True)
        init = jax.jit(optimizer.init)
        state_bytes[case.name] = buffer_bytes(jax.eval_shape(init, params))

        def setup(init=init):
            return _copy(params), init(params), _copy(data)

        timed.append(Case(case.name, setup, step))
    timings = time_interleaved(timed, repeats=repeats, progress=log)

    parameter_bytes = 4 * count  # the passes are counted in float32 parameter-sized arrays
    rows = []
    for case, t in zip(cases, timings):
        mib = {k.replace("_bytes", "_mib"): None if v is None else v / 2**20 for k, v in t.memory.items()}
        accessed, copy_bytes = t.traffic["bytes_accessed"], t.traffic["copy_bytes"]
        rows.append(
            {
                "optimizer": case.name,
                "description": case.description,
                "median_ms": 1e3 * t.median,
                "ms_per_repeat": [1e3 * s for s in t.seconds],
                "median_cpu_ms": 1e3 * t.median_cpu,
                "cpu_ms_per_repeat": [1e3 * s for s in t.cpu_seconds],
                "spread": t.spread,
                "calls_per_repeat": t.calls_per_repeat,
                "compile_s": t.compile_seconds,
                "state_bytes": state_bytes[case.name],
                "state_bytes_per_param": state_bytes[case.name] / count,
                **t.memory,
                "peak_mib": mib["peak_mib"],
                "temp_mib": mib["temp_mib"],
                **t.traffic,
                "hlo_passes": None if accessed is None else accessed / parameter_bytes,
                "copy_mib": None if copy_bytes is None else copy_bytes / 2**20,
            }
        )
    if unguarded_traffic:
        for case, row in zip(cases, rows):
            row.update(_unguarded_traffic(case, params, data, gradient_and_objective, parameter_bytes, row))
    base = next((r for r in rows if r["optimizer"] == baseline), None)
    for row in rows:
        r = ratios(row, base)
        row["ratio_to_adamw"], row["cpu_ratio_to_adamw"] = r["wall"], r["cpu"]
    return rows


def _unguarded_traffic(case: OptimizerCase, params: Any, data: Any, gradient_and_objective: Callable,
                       parameter_bytes: int, guarded_row: dict) -> dict:
    """The HLO passes of ``case``'s step without the non-finite guard (compiled, not run), and the guard's share."""
    optimizer, step = make_step(case, gradient_and_objective, guarded=False)
    with case.tracing():
        inputs = jax.eval_shape(lambda p, d: (p, optimizer.init(p), d), params, data)
        compiled = jax.jit(step, donate_argnums=0).lower(inputs).compile()
    accessed = hlo_traffic(compiled)["bytes_accessed"]
    passes = None if accessed is None else accessed / parameter_bytes
    guarded = guarded_row["hlo_passes"]
    return {"hlo_passes_unguarded": passes,
            "guard_hlo_passes": None if passes is None or guarded is None else guarded - passes}
