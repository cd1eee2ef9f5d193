"""The optimizer update compiled by the TPU compiler, ahead of time, on this (CPU-only) machine: XLA:TPU's own figures.

The update is memory-bound, so what it costs on a TPU is the bytes XLA:TPU's optimized program reads and writes.
``libtpu`` (the ``tpu`` extra of jax) compiles for an abstract TPU topology without a TPU: the compiled program's
``cost_analysis()`` gives ``bytes accessed`` and ``memory_analysis()`` its temporaries, per chip, as the TPU toolchain
computes them. Passes are those bytes divided by the parameters' float32 bytes (per chip: sharded, a chip holds 1/n).

Targets are one chip of a generation (a program on one device of the topology) or FSDP over n chips: every tensor
sharded on its largest dimension that n divides (replicated if none), the way Levanter's FSDP splits ``embed``.

A cost goal must hold for every honest way of building the program (:data:`CONSTRUCTIONS`): the gradient donated with
the parameters and the state, as a train step's gradient is its own temporary, or its own input that the update may
not overwrite. Each is compiled with the optimizer inside the non-finite guard every trainer wraps it in (the update
training runs) and without it, so that the guard's own cost shows.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import numpy as np

from levanter_mars.bench.hlo import traffic
from levanter_mars.bench.models import parameter_count, select


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


@dataclasses.dataclass(frozen=True)
class Construction:
    """How the update's program receives the gradient: ``donated`` with the parameters and state (the update may
    write over it), or as its own input that it may not."""

    name: str
    gradient_donated: bool
    description: str


CONSTRUCTIONS = {
    c.name: c
    for c in (
        Construction("donated", True, "step((params, state, gradient)), all donated; the gradient is returned as is"),
        Construction("own-gradient", False, "step((params, state), gradient), params and state donated, the gradient not"),
    )
}


def select_constructions(names: str) -> list[Construction]:
    return select(names, CONSTRUCTIONS, "--constructions")


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


def _lowered(step: Any, inputs: tuple, construction: Construction) -> Any:
    if construction.gradient_donated:
        return jax.jit(step, donate_argnums=0).lower(inputs)

    def update(params_and_state, data):
        new_params, new_state, _ = step((*params_and_state, data))
        return new_params, new_state

    return jax.jit(update, donate_argnums=0).lower(inputs[:2], inputs[2])


def compile_update(step: Any, init: Any, params: Any, data: Any, target: TpuTarget,
                   construction: Construction = CONSTRUCTIONS["donated"]) -> dict[str, Any]:
    """Compile the step ``step((params, state, data))``, built as ``construction`` says, for ``target``; XLA:TPU's
    traffic and memory."""
    mesh = mesh_for(target)
    shapes = jax.eval_shape(lambda p, d: (p, init(p), d), params, data)
    inputs = abstract_on(shapes, mesh)
    start = time.perf_counter()
    with mesh:
        compiled = _lowered(step, inputs, construction).compile()
    seconds = time.perf_counter() - start
    found = traffic(compiled)
    stats = compiled.memory_analysis()
    parameter_bytes = 4 * parameter_count(params) / target.chips

    def passes(key: str, times: int = 1) -> Any:
        return None if found[key] is None else times * found[key] / parameter_bytes

    return {
        "target": target.name,
        "topology": target.topology,
        "chips": target.chips,
        "construction": construction.name,
        "tpu_passes": passes("bytes_accessed"),
        "tpu_temp_mib": getattr(stats, "temp_size_in_bytes", 0) / 2**20,
        "tpu_copy_mib": None if found["copy_bytes"] is None else found["copy_bytes"] / 2**20,
        # Of tpu_passes, the staging between memory spaces (bench.hlo): each staged array is read and written once.
        "tpu_staging_passes": passes("staging_bytes", 2),
        # What the program's own operations move, staging left out (bench.hlo.own_traffic, an estimate).
        "tpu_own_passes": passes("own_bytes"),
        # What crosses between HBM and the chip, each staged array once (bench.hlo.hbm_traffic, an estimate).
        "tpu_hbm_passes": passes("hbm_bytes"),
        "tpu_bytes_accessed": found["bytes_accessed"],
        "compile_s": seconds,
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


#: The figures of one compile that ``compare`` keeps, by the suffix of their key.
FIGURES = {"passes": "tpu_passes", "temp_mib": "tpu_temp_mib", "copy_mib": "tpu_copy_mib",
           "staging_passes": "tpu_staging_passes", "own_passes": "tpu_own_passes", "hbm_passes": "tpu_hbm_passes",
           "compile_s": "compile_s"}


def key(target: TpuTarget, construction: Construction, figure: str, guarded: bool = True) -> str:
    """A row's key for ``figure`` (``passes``, ``ratio``, ``temp_mib``, ...): ``v5e_donated_passes`` for the update
    training runs (inside the non-finite guard), ``v5e_donated_unguarded_passes`` for the optimizer alone, and
    ``v5e_donated_guard_passes`` for the difference, the guard's own cost."""
    return f"{target.name}_{construction.name}_{'' if guarded else 'unguarded_'}{figure}"


def columns(targets: Sequence[TpuTarget], constructions: Sequence[Construction] = (CONSTRUCTIONS["donated"],),
            unguarded: bool = True) -> list[tuple[str, str]]:
    """Table columns of :func:`compare`'s figures: per target and construction, passes and x AdamW with the guard
    (and without it, and the guard's own passes), and the temporaries."""
    out = []
    for t in targets:
        for c in constructions:
            name = f"{t.name} {c.name}"
            out += [(key(t, c, "passes"), f"{name} passes"), (key(t, c, "ratio"), f"{name} x AdamW")]
            if unguarded:
                out += [(key(t, c, "passes", False), f"{name} unguarded passes"),
                        (key(t, c, "ratio", False), f"{name} unguarded x AdamW"),
                        (key(t, c, "guard_passes"), f"{name} guard passes")]
            out += [(key(t, c, "hbm_passes"), f"{name} HBM passes"), (key(t, c, "temp_mib"), f"{name} temp MiB")]
    return out


def compare(cases: Sequence[Any], params: Any, gradient_and_objective: Any, targets: Sequence[TpuTarget],
            constructions: Sequence[Construction] = (CONSTRUCTIONS["donated"],), unguarded: bool = True,
            baseline: str = "adamw", progress: Any = print, guarded: bool = True) -> dict[str, dict[str, Any]]:
    """``{optimizer: {key(target, construction, figure[, guarded]): value}}`` (:func:`key`): the update benchmark's
    step (``bench.optimizers.make_step``) of every case compiled by XLA:TPU for every target and construction,
    with ``guarded`` inside the non-finite guard and, with ``unguarded``, without it; ratios are to ``baseline``'s,
    built the same way."""
    from levanter_mars.bench.optimizers import make_step

    # Inside the non-finite guard; the optimizer alone.
    variants = tuple(v for v, wanted in ((True, guarded), (False, unguarded)) if wanted)
    if not variants:
        raise ValueError("compare: nothing to compile (neither guarded nor unguarded)")
    shapes = jax.eval_shape(lambda p: p, params)
    found: dict[str, dict[str, Any]] = {}
    for case in cases:
        row = found.setdefault(case.name, {})
        for inside in variants:
            optimizer, step = make_step(case, gradient_and_objective, guarded=inside)
            for target in targets:
                for construction in constructions:
                    with case.tracing():
                        result = compile_update(step, optimizer.init, shapes, shapes, target, construction)
                    progress(f"{target.name} {construction.name} {case.name}{'' if inside else ' unguarded'}: "
                             f"{result['tpu_passes']:.2f} passes, temp {result['tpu_temp_mib']:.0f} MiB, "
                             f"compiled in {result['compile_s']:.0f} s")
                    for figure, field in FIGURES.items():
                        row[key(target, construction, figure, inside)] = result[field]
    base = found.get(baseline, {})
    for row in found.values():
        for target in targets:
            for construction in constructions:
                for inside in variants:
                    field = key(target, construction, "passes", inside)
                    b = base.get(field)
                    row[key(target, construction, "ratio", inside)] = None if not b else row[field] / b
                if guarded and unguarded:
                    row[key(target, construction, "guard_passes")] = (
                        row[key(target, construction, "passes")] - row[key(target, construction, "passes", False)])
    return found
