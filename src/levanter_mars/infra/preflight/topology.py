"""A launcher slice name as the TPU compiler sees it: topology, chips, JAX devices, HBM per chip.

Slice names count TensorCores on v4 and v5p (v4-32 is 16 chips of 2 cores) and chips on v5e and v6e (v5litepod-16
is 16 chips of 1 core). On a real v4/v5p pod JAX runs the two cores of a chip as one device ("megacore"), so
its devices are chips; the abstract topology gives one device per core unless it is asked for ``megacore``.
Chip counts and hosts come from Levanter's slice table (``infra/slices.py``), the one the launcher accepts.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterator

from levanter_mars.infra.slices import GENERATIONS, GiB, SliceType  # noqa: F401 - GiB is re-exported


class PreflightError(ValueError):
    """Pre-flight cannot run (no TPU compiler, a slice it cannot model): the message says why."""


#: Torus shapes that the doubling rule below does not produce (Google Cloud's v5p table).
_IRREGULAR_3D = {6144: (16, 16, 24)}


def _shape_3d(chips: int) -> tuple[int, ...]:
    """v4/v5p: 4 chips are 2x2x1; each doubling doubles the smallest dimension, the last of equals (2x2x2, 2x2x4,
    2x4x4, 4x4x4, ...), as in Google Cloud's topology tables."""
    if chips in _IRREGULAR_3D:
        return _IRREGULAR_3D[chips]
    if chips < 4 or chips & (chips - 1):
        raise PreflightError(f"no known 3D torus for {chips} chips")
    shape = [2, 2, 1]
    while shape[0] * shape[1] * shape[2] < chips:
        smallest = min(shape)
        index = max(i for i, d in enumerate(shape) if d == smallest)
        shape[index] *= 2
    return tuple(shape)


def _shape_2d(chips: int) -> tuple[int, ...]:
    """v5e/v6e: 1x1, 1x2, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16."""
    if chips & (chips - 1):
        raise PreflightError(f"no known 2D torus for {chips} chips")
    shape = [1, 1]
    while shape[0] * shape[1] < chips:
        shape[0 if shape[0] < shape[1] else 1] *= 2
    return tuple(shape)


@dataclass(frozen=True)
class TpuTarget:
    tpu_type: str
    generation: str
    topology: str
    """The name the TPU compiler takes, e.g. ``v4:2x2x4``."""
    chips: int
    cores_per_chip: int
    megacore: bool
    hosts: int

    @property
    def devices(self) -> int:
        """JAX devices of one slice, as a real pod shows them."""
        return self.chips if self.megacore else self.chips * self.cores_per_chip

    @property
    def hbm_bytes_per_chip(self) -> int:
        return GENERATIONS[self.generation].hbm_bytes_per_chip

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    def describe(self) -> dict:
        return {
            "tpu_type": self.tpu_type, "topology": self.topology, "chips": self.chips,
            "tensorcores": self.chips * self.cores_per_chip, "jax_devices": self.devices, "hosts": self.hosts,
            "megacore": self.megacore, "hbm_gib_per_chip": self.hbm_bytes_per_chip / GiB,
        }


def tpu_target(kind: SliceType) -> TpuTarget:
    """The compiler's view of a launcher slice (``slices.slice_type(name)``)."""
    if kind.is_local:
        raise PreflightError("--tpu_type cpu is the local engine: pre-flight compiles for a TPU slice type")
    if kind.generation not in GENERATIONS:
        raise PreflightError(f"--tpu_type {kind.name!r}: no TPU compiler target known for {kind.generation}")
    generation = GENERATIONS[kind.generation]
    prefix, cores, megacore = generation.compiler_name, generation.cores_per_chip, generation.megacore
    # Levanter's table counts chips (``chip_count``) whatever the name counts.
    chips = kind.devices
    shape = _shape_3d(chips) if cores == 2 else _shape_2d(chips)
    topology = f"{prefix}:{'x'.join(str(d) for d in shape)}"
    return TpuTarget(kind.name, kind.generation, topology, chips, cores, megacore, kind.hosts)


@contextlib.contextmanager
def libtpu_startup_noise_held() -> Iterator[None]:
    """libtpu writes to the process's stderr (file descriptor 2, below Python's ``sys.stderr``) as it loads on a
    machine that is no TPU VM: it asks for the VM's accelerator type and worker hostnames, finds none, and says so
    (``Failed to find host bounds``, ``E0000 ... unexpected worker hostname``), though the topology it then builds is
    the one asked for. Those lines came before pre-flight's verdict. What is written meanwhile is held: dropped when
    the block succeeds, written to stderr when it raises (then it may say why)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            except BaseException:
                sys.stderr.flush()
                os.dup2(saved, 2)
                held.seek(0)
                os.write(2, held.read())
                raise
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def abstract_devices(target: TpuTarget, num_slices: int = 1) -> list:
    """The slice's devices as the TPU compiler models them (no TPU needed; needs the ``libtpu`` wheel)."""
    # No TPU is used, and other compiles (other users, parallel tests) may hold libtpu's one-process lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "true")
    try:
        from jax.experimental import topologies

        options = {"chip_config_name": "megacore"} if target.megacore else {}
        if num_slices > 1:
            options["num_slices"] = num_slices
        # Small v5e/v6e slices have fewer chips than libtpu's default host (2x2): give the host the slice's shape.
        if target.chips < 4:
            options["chips_per_host_bounds"] = tuple(int(d) for d in target.topology.split(":")[1].split("x")) + (1,)
        with libtpu_startup_noise_held():  # libtpu loads here, on the first topology of the process
            description = topologies.get_topology_desc(platform="tpu", topology_name=target.topology, **options)
    except Exception as e:  # noqa: BLE001 - no libtpu, or a libtpu that cannot model the slice: say which
        raise PreflightError(
            f"cannot build the TPU topology {target.topology} for --tpu_type {target.tpu_type}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Pre-flight needs the libtpu wheel "
            "beside jax (make setup installs it; the TPU compiler exists only for Linux x86_64)"
        ) from None
    devices = list(description.devices)
    expected = target.devices * num_slices
    if len(devices) != expected:
        raise PreflightError(
            f"the TPU compiler's {target.topology} has {len(devices)} devices, expected {expected} for "
            f"{num_slices} x {target.tpu_type}"
        )
    return devices
