"""The HBM per chip a program may use, as the TPU compiler states it: what pre-flight judges every program against.

A chip's nominal HBM (32 GiB on v4) is not all the program's: the runtime keeps some. The compiler states the usable
figure only when it refuses a program ("Used 49.09G of 30.75G hbm", libtpu 0.0.37; "exceeds available HBM
(30.75G)", 0.0.42.1), so pre-flight asks it: a probe, the sum of arguments of twice the nominal HBM per chip on
the slice's devices, is refused in seconds, and the refusal states the capacity. A program's own refusal states the
same figure and is used when there is one, except a refusal of one buffer alone ("Allocation (size=...) would exceed
memory (size=...)"), which states the physical memory (32 GiB on v4). Where the compiler states none (a refusal in
words pre-flight cannot read, or no refusal), the capacity is ``FALLBACK_FRACTION`` of the nominal.
"""

from __future__ import annotations

from dataclasses import dataclass
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from levanter_mars.infra.preflight.step import ONE_BUFFER, Compiled, out_of_memory

#: The smallest share of the nominal HBM any libtpu has stated usable here: 30.75 of 32 GiB on v4 (libtpu 0.0.37 and
#: 0.0.42.1; on v5e both state 15.75 of 16). Used only where the compiler states no capacity.
FALLBACK_FRACTION = 30.75 / 32
FALLBACK_SOURCE = (f"{FALLBACK_FRACTION:.4f} x the nominal HBM (30.75 of 32 GiB, what libtpu 0.0.37 and 0.0.42.1 "
                   "state for v4, the smallest share stated): the compiler stated no capacity here")
_ROW = 2**20  # float32 elements per row of the probe's argument


@dataclass(frozen=True)
class UsableHbm:
    bytes: int
    """Per chip."""
    source: str
    """Where the figure comes from: the compiler's words, or the fallback's reason."""


def fallback(nominal_bytes: int, why: str) -> UsableHbm:
    return UsableHbm(int(nominal_bytes * FALLBACK_FRACTION), f"{FALLBACK_SOURCE} ({why})")


def probe(devices: list, nominal_bytes: int) -> UsableHbm:
    """The capacity the TPU compiler states for ``devices`` (abstract, see ``topology.abstract_devices``), by refusing
    arguments of twice ``nominal_bytes`` per device in all: four of half the nominal each, so that no single buffer
    is refused alone (that refusal states the physical memory, not what a program may use)."""
    rows = -(-nominal_bytes // (2 * 4 * _ROW))
    mesh = Mesh(np.array(devices), ("devices",))
    argument = jax.ShapeDtypeStruct((rows * len(devices), _ROW), jnp.float32,
                                    sharding=NamedSharding(mesh, PartitionSpec("devices")))
    size = f"{4 * rows * _ROW * 4 / 2**30:.0f} GiB per chip"
    try:
        jax.jit(lambda *xs: sum(jnp.sum(x) for x in xs)).lower(*[argument] * 4).compile()
    except Exception as e:  # noqa: BLE001 - only the compiler's out-of-memory verdict is an answer
        verdict = out_of_memory(str(e))
        if verdict is None or verdict.counts == ONE_BUFFER:
            return fallback(nominal_bytes, f"its refusal of a probe of {size} did not state it: "
                                           f"{str(e).splitlines()[0][:200]}")
        return UsableHbm(verdict.capacity, f"the TPU compiler's refusal of a probe of {size}: {verdict.line}")
    return fallback(nominal_bytes, f"it accepted a probe of {size}")


def usable_hbm(compiled: Compiled, devices: list, nominal_bytes: int) -> UsableHbm:
    """The program's own refusal's capacity if it was refused for the whole program or its temporaries, else the
    probe's (a refusal of one buffer states the physical memory: 32 GiB on v4, where a program may use 30.75)."""
    if compiled.capacity_bytes is not None and compiled.used_counts != ONE_BUFFER:
        said = f"the TPU compiler's refusal of this program: {compiled.out_of_memory}"
        return UsableHbm(compiled.capacity_bytes, said)
    return probe(devices, nominal_bytes)
