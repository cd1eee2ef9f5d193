"""TPU slice types, the Ray resources that target them, and the device mesh a training config gets on them.

Slice geometry comes from Levanter's table (``levanter.infra.ray_tpu.TPU_CONFIGS``), the one its scheduler
(``run_on_pod``) uses, and the mesh arithmetic from Levanter's ``TrainerConfig`` properties, so a dry run shows
what the hosts will build.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from dataclasses import dataclass
from typing import Any, Mapping

from levanter.infra.ray_tpu import TPU_CONFIGS, get_tpu_config
from levanter.trainer import TrainerConfig

from levanter_mars.infra.config import TPU_TYPE_ALIASES, LaunchError
# LOCAL_SLICE, ``--tpu_type cpu``: the local engine, a Ray cluster on this machine with one node per simulated host,
# posing as a v4 slice with that many hosts (``local_node.py``).
from levanter_mars.infra.local_node import LOCAL_SLICE, LOCAL_SLICE_SHAPES

# What levanter.infra.ray_tpu.TPUHostActor.run_remote_fn asks of every host besides its chips (levanter
# 1.2.dev1644). A node that cannot offer them never gets the task: the local engine must declare them.
HOST_TASK_CPUS = 8
HOST_TASK_MEMORY_BYTES = 20 * 10**9


GiB = 1024**3


@dataclass(frozen=True)
class Generation:
    """What a TPU generation is, for the launcher and for pre-flight: one row per generation, nowhere else."""

    compiler_name: str
    """The prefix of the TPU compiler's topology names (``v5e:4x4``)."""
    cores_per_chip: int
    """TensorCores per chip: slice names count them on v4/v5p (v4-32 is 16 chips), chips on v5e/v6e."""
    megacore: bool
    """JAX on a pod runs a chip's cores as one device (one JAX device per chip)."""
    hbm_bytes_per_chip: int
    runtime_version: str
    """The TPU VM software image for JAX (gcloud --runtime-version / node_config.runtimeVersion)."""
    vcpus_per_host: int
    """vCPUs of a full host's VM (the data step's estimate counts them; smaller v5e/v6e hosts have fewer)."""


#: Per slice-name prefix. HBM and cores per chip: Google Cloud TPU documentation, "TPU versions" and the per-version
#: system architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e), checked 2026-12: v4 32 GiB and 2
#: TensorCores (megacore), v5e 16 GiB and 1, v5p 95 GiB and 2 (megacore), v6e (Trillium) 32 GiB and 1. Runtime
#: versions: the same docs' "TPU software versions" page. vCPUs per host: the machine types of those pages (v4
#: ct4p-hightpu-4t 240, v5e ct5lp-hightpu-8t 224, v5p ct5p-hightpu-4t 208, v6e ct6e-standard-8t 180).
GENERATIONS = {
    "v4": Generation("v4", 2, True, 32 * GiB, "tpu-ubuntu2204-base", 240),
    "v5litepod": Generation("v5e", 1, False, 16 * GiB, "v2-alpha-tpuv5-lite", 224),
    "v5p": Generation("v5p", 2, True, 95 * GiB, "v2-alpha-tpuv5", 208),
    "v6e": Generation("v6e", 1, False, 32 * GiB, "v2-alpha-tpuv6e", 180),
}
RUNTIME_VERSIONS = {name: g.runtime_version for name, g in GENERATIONS.items()}


def head_resource(tpu_type: str) -> str:
    """The Ray resource worker 0 of a slice carries, and one slice of a job asks for (Ray and Levanter's naming)."""
    return f"TPU-{tpu_type}-head"


@dataclass(frozen=True)
class SliceType:
    name: str
    hosts: int
    """VMs in the slice: one training process each."""
    chips_per_host: int
    devices: int
    """JAX devices in the slice (one per chip on v4/v5p megacore and on v5e/v6e)."""

    @property
    def devices_per_host(self) -> int:
        return self.devices // self.hosts

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL_SLICE

    @property
    def generation(self) -> str:
        return self.name.split("-")[0]

    @property
    def runtime_version(self) -> str:
        return GENERATIONS[self.generation].runtime_version

    def host_resources(self) -> dict[str, float]:
        """What each host's training task asks Ray for."""
        return {"TPU": self.chips_per_host, "CPU": HOST_TASK_CPUS, "memory": HOST_TASK_MEMORY_BYTES}

    def job_resources(self, num_slices: int) -> dict[str, Any]:
        return {
            "per_slice": {head_resource(self.name): 1},
            "per_host": self.host_resources(),
            "hosts_per_slice": self.hosts,
            "slices": num_slices,
            "total": {
                head_resource(self.name): num_slices,
                **{k: v * self.hosts * num_slices for k, v in self.host_resources().items()},
            },
        }


def local_device_count(environ: Mapping[str, str] = os.environ) -> int:
    """CPU devices JAX will see: 1 unless XLA_FLAGS forces more."""
    match = re.search(r"--xla_force_host_platform_device_count=(\d+)", environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else 1


def local_slice(hosts: int = 1, devices_per_host: int | None = None) -> SliceType:
    """The local pod: ``hosts`` training processes with ``devices_per_host`` simulated CPU devices each (default: as
    many as this shell's XLA_FLAGS give one process)."""
    if hosts not in LOCAL_SLICE_SHAPES:
        raise LaunchError(
            f"--num_hosts {hosts}: the local pod poses as a v4 slice, which has {sorted(LOCAL_SLICE_SHAPES)} hosts"
        )
    devices_per_host = local_device_count() if devices_per_host is None else devices_per_host
    if devices_per_host < 1:
        raise LaunchError(f"--devices_per_host must be >= 1, got {devices_per_host}")
    posing = get_tpu_config(LOCAL_SLICE_SHAPES[hosts][0])
    return SliceType(LOCAL_SLICE, hosts=hosts, chips_per_host=posing.chips_per_vm, devices=hosts * devices_per_host)


MAX_LOCAL_NODES = max(LOCAL_SLICE_SHAPES)
"""The local pod starts one Ray node (raylet, agents) per host on this machine: no more than one slice's most."""


def check_local_nodes(hosts: int, slices: int) -> int:
    """The local pod's Ray nodes for ``slices`` slices of ``hosts`` hosts, or LaunchError naming the flag."""
    if slices < 1:
        raise LaunchError(f"--num_slices must be >= 1, got {slices}")
    if hosts * slices > MAX_LOCAL_NODES:
        raise LaunchError(
            f"--num_slices {slices} x --num_hosts {hosts}: the local pod starts one Ray node per host on this "
            f"machine, at most {MAX_LOCAL_NODES} in all"
        )
    return hosts * slices


def launch_slice(tpu_type: str, num_hosts: int = 1, devices_per_host: int | None = None) -> SliceType:
    """The slice a launch asks for: a TPU type fixes its hosts and chips; ``cpu`` takes them from the flags."""
    if tpu_type == LOCAL_SLICE:
        return local_slice(num_hosts, devices_per_host)
    if num_hosts != 1 or devices_per_host is not None:
        raise LaunchError(
            f"--num_hosts and --devices_per_host are for --tpu_type {LOCAL_SLICE} (the local pod): "
            f"a {tpu_type} slice has the hosts and chips of its type"
        )
    return slice_type(tpu_type)


def closest_tpu_type(name: str) -> str | None:
    """The known spelling (a name of Levanter's table, or its alias: ``v5e-16``) closest to ``name``, if any is."""
    alias_of = {generation: alias for alias, generation in TPU_TYPE_ALIASES.items()}
    spellings = [LOCAL_SLICE]
    for config in TPU_CONFIGS:
        generation, _, size = config.name.partition("-")
        spellings += [config.name, f"{alias_of[generation]}-{size}"] if generation in alias_of else [config.name]
    close = difflib.get_close_matches(name.lower(), spellings, n=1, cutoff=0.6)
    return close[0] if close else None


def slice_type(name: str) -> SliceType:
    """A slice name as the launcher's command line gives it (``config.canonical_tpu_type`` applied)."""
    if name == LOCAL_SLICE:
        return local_slice()
    try:
        config = get_tpu_config(name)
    except ValueError:
        close = closest_tpu_type(name)
        hint = f"; did you mean {close!r}?" if close else "."
        known = ", ".join(c.name for c in TPU_CONFIGS)
        raise LaunchError(
            f"--tpu_type: unknown slice type {name!r}{hint} Known: {LOCAL_SLICE}, {known} (v5e-N is v5litepod-N)"
        ) from None
    if name.split("-")[0] not in GENERATIONS:
        raise LaunchError(f"--tpu_type {name!r}: no TPU generation known for it ({sorted(GENERATIONS)})")
    return SliceType(name, hosts=config.vm_count, chips_per_host=config.chips_per_vm, devices=config.chip_count)


def neighbour_slice(tpu_type: str, larger: bool) -> str | None:
    """The next larger (or smaller) slice of the same generation in the launcher's table, by chips."""
    generation = tpu_type.split("-")[0]
    chips = get_tpu_config(tpu_type).chip_count
    same = sorted((c.chip_count, c.name) for c in TPU_CONFIGS if c.name.split("-")[0] == generation)
    if larger:
        candidates = [name for n, name in same if n > chips]
    else:
        candidates = [name for n, name in reversed(same) if n < chips]
    return candidates[0] if candidates else None


@dataclass(frozen=True)
class MeshPlan:
    """The (replica, data, model) device mesh Levanter builds, split into its ICI (in-slice) and DCN (across
    slices) factors, and how the batch lands on it."""

    num_slices: int
    devices_per_slice: int
    ici: dict[str, int]
    dcn: dict[str, int]
    axes: dict[str, int]
    batch_size: int | None
    examples_per_device_step: int | None
    microbatches: int | None

    @property
    def devices(self) -> int:
        return self.num_slices * self.devices_per_slice

    def one_line(self) -> str:
        """As the run logs its mesh: ``replica 2 (DCN 2 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 2 slice(s) of 2
        device(s)``."""
        from levanter_mars.compat.levanter_slices import describe_mesh

        return describe_mesh(types.SimpleNamespace(
            replica_axis_size=self.axes["replica"], replica_dcn_axis_size=self.dcn["replica"],
            replica_ici_axis_size=self.ici["replica"], data_dcn_axis_size=self.dcn["data"],
            data_ici_axis_size=self.ici["data"], model_axis_size=self.axes["model"], num_slices=self.num_slices,
            num_devices_per_slice=self.devices_per_slice,
        ))  # fmt: skip

    def warnings(self) -> list[str]:
        out = []
        if self.dcn["data"] > 1:
            out.append(
                f"parameters are FSDP-sharded across {self.dcn['data']} slices over DCN (slow all-gathers every "
                "step); set trainer.replica_dcn_axis_size=-1 to replicate them across slices instead"
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "slices": self.num_slices,
            "devices_per_slice": self.devices_per_slice,
            "mesh_axes": dict(self.axes),
            "ici_per_slice": dict(self.ici),
            "dcn_across_slices": dict(self.dcn),
            "batch": {
                "train_batch_size": self.batch_size,
                "sharded_over": "replica x data",
                "examples_per_device_per_microbatch": self.examples_per_device_step,
                "microbatches_per_step": self.microbatches,
            },
            "warnings": self.warnings(),
        }


def plan_mesh(trainer: TrainerConfig, devices_per_slice: int, num_slices: int) -> MeshPlan:
    """Levanter's mesh for ``trainer`` on ``num_slices`` x ``devices_per_slice`` devices, computed with
    ``TrainerConfig``'s own property code on a stand-in for the (not yet existing) device list."""
    replica_dcn = num_slices if trainer.replica_dcn_axis_size == -1 else trainer.replica_dcn_axis_size
    if replica_dcn < 1 or num_slices % replica_dcn:
        raise LaunchError(
            f"trainer.replica_dcn_axis_size={trainer.replica_dcn_axis_size} must divide --num_slices={num_slices} "
            "(or be -1: one replica per slice)"
        )
    mesh = types.SimpleNamespace(
        num_slices=num_slices,
        num_devices_per_slice=devices_per_slice,
        replica_ici_axis_size=trainer.replica_ici_axis_size,
        model_axis_size=trainer.model_axis_size,
        replica_dcn_axis_size=replica_dcn,
    )
    if devices_per_slice % (mesh.replica_ici_axis_size * mesh.model_axis_size):
        raise LaunchError(
            f"trainer.replica_ici_axis_size={mesh.replica_ici_axis_size} x trainer.model_axis_size="
            f"{mesh.model_axis_size} must divide the {devices_per_slice} devices of one slice"
        )
    mesh.data_ici_axis_size = TrainerConfig.data_ici_axis_size.fget(mesh)
    mesh.data_dcn_axis_size = TrainerConfig.data_dcn_axis_size.fget(mesh)
    batch_axis = TrainerConfig.data_axis_size.fget(mesh)  # Levanter's name for replica x data

    batch = trainer.train_batch_size if isinstance(trainer.train_batch_size, int) else None
    per_device = trainer.per_device_parallelism
    if batch is not None and batch > 0 and per_device < 0:
        per_device = batch // batch_axis
    microbatches = None
    if batch is not None and batch > 0 and per_device > 0 and batch % (per_device * batch_axis) == 0:
        microbatches = batch // (per_device * batch_axis)
    return MeshPlan(
        num_slices=num_slices,
        devices_per_slice=devices_per_slice,
        ici={"replica": mesh.replica_ici_axis_size, "data": mesh.data_ici_axis_size, "model": mesh.model_axis_size},
        dcn={"replica": replica_dcn, "data": mesh.data_dcn_axis_size, "model": 1},
        axes={
            "replica": mesh.replica_ici_axis_size * replica_dcn,
            "data": mesh.data_ici_axis_size * mesh.data_dcn_axis_size,
            "model": mesh.model_axis_size,
        },
        batch_size=batch,
        examples_per_device_step=per_device if per_device > 0 else None,
        microbatches=microbatches,
    )
