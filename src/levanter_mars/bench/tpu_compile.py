"""The optimizer update compiled by the TPU compiler, ahead of time, on this (CPU-only) machine: XLA:TPU's own figures.

The update is memory-bound, so what it costs on a TPU is the bytes XLA:TPU's optimized program reads and writes.
``libtpu`` (the ``tpu`` extra of jax) compiles for an abstract TPU topology without a TPU: the compiled program's
``cost_analysis()`` gives ``bytes accessed`` and ``memory_analysis()`` its temporaries, per chip, as the TPU toolchain
computes them. Passes are those bytes divided by the parameters' float32 bytes (per chip: sharded, a chip holds 1/n).

Targets are one chip of a generation (a program on one device of the topology) or FSDP over n chips: every tensor
sharded on its largest dimension that n divides (replicated if none), the way Levanter's FSDP splits ``embed``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import jax
import numpy as np

from levanter_mars.bench.hlo import traffic
from levanter_mars.bench.models import select


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """``name``: what the tables show; ``topology``: the abstract topology; ``chips``: devices the update spans."""

    name: str
    topology: str
    chips: int


#: One chip of each generation (the smallest topology libtpu accepts, of which one device is used), and FSDP over 16.
TARGETS = {
    t.name: t
    for t in (
        TpuTarget("v4", "v4:2x2x1", 1),
        TpuTarget("v5e", "v5e:2x2", 1),
        TpuTarget("v5p", "v5p:2x2x1", 1),
        TpuTarget("v6e", "v6e:2x2", 1),
        TpuTarget("v5e-fsdp16", "v5e:4x4", 16),
    )
}


def select_targets(names: str) -> list[TpuTarget]:
    return select(names, TARGETS, "--tpu")


def mesh_for(target: TpuTarget) -> jax.sharding.Mesh:
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock file on load, which would refuse a second compiling process (another
    # benchmark, a test) although no TPU is opened here.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

    devices = topologies.get_topology_desc(platform="tpu", topology_name=target.topology).devices
    if len(devices) < target.chips:
        raise SystemExit(f"topology {target.topology} has {len(devices)} devices, fewer than {target.chips}")
    return jax.sharding.Mesh(np.array(devices[: target.chips]), ("data",))


def fsdp_spec(shape: Sequence[int], chips: int, names: Sequence[str] | None = None) -> jax.sharding.PartitionSpec:
    """Levanter's FSDP: the ``embed`` axis on the data axis when ``chips`` divides it; otherwise (plain arrays, no
    ``embed``) the largest dimension ``chips`` divides; replicated if there is none."""
    P = jax.sharding.PartitionSpec
    if chips == 1:
        return P()
    candidates = [i for i, d in enumerate(shape) if d % chips == 0]
    if names is not None and "embed" in names and names.index("embed") in candidates:
        axis = names.index("embed")
    elif candidates:
        axis = max(candidates, key=lambda i: shape[i])
    else:
        return P()
    return P(*(("data" if i == axis else None) for i in range(len(shape))))


def abstract_on(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """``ShapeDtypeStruct`` leaves placed on ``mesh``, parameter-shaped buffers sharded like parameters."""
    import haliax as hax

    chips = mesh.devices.size

    def place(x, names=None):
        sharding = jax.sharding.NamedSharding(mesh, fsdp_spec(x.shape, chips, names))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    def place_named_or_plain(x):
        if hax.is_named_array(x):
            names = tuple(axis.name for axis in x.axes)
            return hax.NamedArray(place(x.array, names), x.axes)
        return place(x)

    return jax.tree.map(place_named_or_plain, tree, is_leaf=hax.is_named_array)


def compile_update(step: Any, init: Any, params: Any, data: Any, target: TpuTarget) -> dict[str, Any]:
    """Compile ``step((params, state, data))`` (inputs donated) for ``target``; XLA:TPU's traffic and memory."""
    mesh = mesh_for(target)
    shapes = jax.eval_shape(lambda p, d: (p, init(p), d), params, data)
    inputs = abstract_on(shapes, mesh)
    with mesh:
        compiled = jax.jit(step, donate_argnums=0).lower(inputs).compile()
    found = traffic(compiled)
    stats = compiled.memory_analysis()
    parameter_bytes = 4 * sum(math.prod(x.shape) for x in jax.tree.leaves(params)) / target.chips
    accessed = found["bytes_accessed"]
    return {
        "target": target.name,
        "topology": target.topology,
        "chips": target.chips,
        "tpu_passes": None if accessed is None else accessed / parameter_bytes,
        "tpu_temp_mib": getattr(stats, "temp_size_in_bytes", 0) / 2**20,
        "tpu_copy_mib": None if found["copy_bytes"] is None else found["copy_bytes"] / 2**20,
        # Of tpu_passes, the staging between memory spaces (bench.hlo): each staged array is read and written once.
        "tpu_staging_passes": None if found["staging_bytes"] is None else 2 * found["staging_bytes"] / parameter_bytes,
        "tpu_bytes_accessed": accessed,
    }


def abstract_gpt2_parameters(size: Any) -> Any:
    """The trainable parameters of the benchmarks' GPT-2 of ``size`` (``bench.models.SIZES``) as shapes only: a
    compile needs no values, and none are allocated."""
    import equinox as eqx
    import jax.numpy as jnp

    from levanter_mars.bench import models

    init, _ = models.gpt2_initializer(size)
    model = jax.eval_shape(init, jax.random.PRNGKey(0))
    return eqx.filter(model, lambda x: hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact))


def columns(targets: Sequence[TpuTarget]) -> list[tuple[str, str]]:
    """Table columns of :func:`compare`'s figures: passes, x AdamW and temporaries per target."""
    out = []
    for t in targets:
        out += [(f"{t.name}_passes", f"{t.name} passes"), (f"{t.name}_ratio", f"{t.name} x AdamW"),
                (f"{t.name}_staging_passes", f"{t.name} of which staging"),
                (f"{t.name}_temp_mib", f"{t.name} temp MiB")]
    return out


def compare(cases: Sequence[Any], params: Any, gradient_and_objective: Any, targets: Sequence[TpuTarget],
            baseline: str = "adamw", progress: Any = print) -> dict[str, dict[str, Any]]:
    """``{optimizer: {"<target>_passes", "<target>_ratio" (to ``baseline``'s), "<target>_temp_mib", ...}}``: the
    update benchmark's step (``bench.optimizers.make_step``) of every case compiled by XLA:TPU for every target."""
    from levanter_mars.bench.optimizers import make_step

    shapes = jax.eval_shape(lambda p: p, params)
    found: dict[str, dict[str, Any]] = {}
    for case in cases:
        optimizer, step = make_step(case, gradient_and_objective)
        row = found.setdefault(case.name, {})
        for target in targets:
            with case.tracing():
                result = compile_update(step, optimizer.init, shapes, shapes, target)
            progress(f"{target.name} {case.name}: {result['tpu_passes']:.2f} passes, "
                     f"temp {result['tpu_temp_mib']:.0f} MiB")
            row[f"{target.name}_passes"] = result["tpu_passes"]
            row[f"{target.name}_temp_mib"] = result["tpu_temp_mib"]
            row[f"{target.name}_copy_mib"] = result["tpu_copy_mib"]
            row[f"{target.name}_staging_passes"] = result["tpu_staging_passes"]
    base = found.get(baseline, {})
    for row in found.values():
        for target in targets:
            b = base.get(f"{target.name}_passes")
            row[f"{target.name}_ratio"] = None if not b else row[f"{target.name}_passes"] / b
    return found
