"""42. Levanter counts slices only from ``device.slice_index`` (``TrainerConfig.num_slices``) and builds the hybrid
ICI/DCN mesh only when devices carry it (``create_fsdp_mesh``): TPU devices carry their slice, CPU devices
(jax 0.10) slice 0 whatever their process, GPU devices none. A
multi-slice job elsewhere (the local pod's slices, each a group of processes, as ``run_on_pod`` starts them with
``MEGASCALE_*``) trains as one slice: the DCN mesh axes, and so the cross-slice reduction a TPU job runs, never exist.

``MarsTrainerConfig`` counts slices with :func:`slices_of_job` and builds its mesh with :func:`create_fsdp_mesh`: the
``MEGASCALE_*`` environment the launcher sets (the same on TPU) counts. The number of slices comes from
``MEGASCALE_NUM_SLICES``, and where devices carry no ``slice_index``, a process's slice is
its place among the processes (slice ``s`` holds processes ``s * H .. s * H + H - 1``, ``H`` hosts per slice, as the
local pod numbers them), checked against its own ``MEGASCALE_SLICE_ID``. The mesh itself is jax's
``create_hybrid_device_mesh``, given the devices with that ``slice_index``."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import jax
import levanter.trainer
from jax.experimental import mesh_utils
from jax.sharding import Mesh

UPSTREAM_CREATE_FSDP_MESH = levanter.trainer.create_fsdp_mesh
NUM_SLICES_ENV = "MEGASCALE_NUM_SLICES"
SLICE_ID_ENV = "MEGASCALE_SLICE_ID"


class SliceLayoutError(ValueError):
    """The processes cannot be the slices the environment names."""


def num_slices(environ: Mapping[str, str] = os.environ) -> int:
    """How many slices the launcher started (1 without ``MEGASCALE_NUM_SLICES``: a one-slice job)."""
    value = environ.get(NUM_SLICES_ENV, "1")
    try:
        count = int(value)
    except ValueError:
        raise SliceLayoutError(f"{NUM_SLICES_ENV}={value!r} is not a number of slices") from None
    if count < 1:
        raise SliceLayoutError(f"{NUM_SLICES_ENV}={value!r}: at least one slice")
    return count


def slice_of_process(process_index: int, process_count: int, slices: int) -> int:
    if process_count % slices:
        raise SliceLayoutError(f"{process_count} processes cannot be {slices} slices of as many hosts each "
                               f"({NUM_SLICES_ENV}={slices})")  # fmt: skip
    return process_index // (process_count // slices)


def check_own_slice(environ: Mapping[str, str] = os.environ) -> None:
    """This process's ``MEGASCALE_SLICE_ID`` must be the slice its process index puts it in."""
    slices = num_slices(environ)
    expected = slice_of_process(jax.process_index(), jax.process_count(), slices)
    if SLICE_ID_ENV in environ and environ[SLICE_ID_ENV] != str(expected):
        raise SliceLayoutError(f"process {jax.process_index()} of {jax.process_count()} is in slice {expected} of "
                               f"{slices}, but {SLICE_ID_ENV}={environ[SLICE_ID_ENV]!r}: the launcher numbered the "
                               "processes out of slice order")  # fmt: skip


class _InSlice:
    """A device as ``create_hybrid_device_mesh`` reads it, with the ``slice_index`` its platform does not give."""

    def __init__(self, device, slice_index: int):
        self.device, self.slice_index = device, slice_index

    def __getattr__(self, name):
        return getattr(self.device, name)


def hybrid_device_mesh(ici_shape: Sequence[int], dcn_shape: Sequence[int], devices: Sequence, slices: int):
    """jax's hybrid mesh of ``devices`` (processes grouped into ``slices`` slices in process order), as an array of
    the devices themselves."""
    processes = sorted({d.process_index for d in devices})
    wrapped = [_InSlice(d, slice_of_process(processes.index(d.process_index), len(processes), slices))
               for d in sorted(devices, key=lambda d: (d.process_index, d.id))]  # fmt: skip
    mesh = mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, wrapped, allow_split_physical_axes=True)
    return _unwrapped(mesh)


def _unwrapped(mesh):
    import numpy as np

    out = np.empty(mesh.shape, dtype=object)
    for index, device in np.ndenumerate(mesh):
        out[index] = device.device
    return out


def slices_of_job(upstream) -> int:
    """The number of slices: the launcher's ``MEGASCALE_NUM_SLICES`` where set, else ``upstream()`` (Levanter's count
    of the devices' slice indices: 1 on CPU)."""
    return num_slices() if NUM_SLICES_ENV in os.environ else upstream()


def _slices_of_devices(devices) -> int:
    # jax >= 0.9 gives CPU devices a slice_index too: 0 for every device, whatever the processes are
    return max(getattr(d, "slice_index", 0) for d in devices) + 1


def create_fsdp_mesh(replica_ici_axis_size: int, data_ici_axis_size: int, model_axis_size: int,
                     replica_dcn_axis_size: int = 1, data_dcn_axis_size: int = 1) -> Mesh:  # fmt: skip
    """Levanter's mesh (replica, data, model); across slices of processes where devices carry no slice index."""
    devices = jax.devices()
    slices = num_slices()
    if slices == 1 or _slices_of_devices(devices) == slices:  # a TPU's own slice indices
        return UPSTREAM_CREATE_FSDP_MESH(replica_ici_axis_size, data_ici_axis_size, model_axis_size,
                                         replica_dcn_axis_size, data_dcn_axis_size)  # fmt: skip
    check_own_slice()
    from haliax.partitioning import ResourceAxis

    array = hybrid_device_mesh((replica_ici_axis_size, data_ici_axis_size, model_axis_size),
                               (replica_dcn_axis_size, data_dcn_axis_size, 1), devices, slices)  # fmt: skip
    return Mesh(array, (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL))


def describe_mesh(trainer_config) -> str:
    """``replica 2 (DCN 2 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 2 slices of 2 devices``: how Levanter's axes map
    onto the slices, for the log."""
    c = trainer_config
    return (f"replica {c.replica_axis_size} (DCN {c.replica_dcn_axis_size} x ICI {c.replica_ici_axis_size}), "
            f"data {c.data_dcn_axis_size * c.data_ici_axis_size} (DCN {c.data_dcn_axis_size} x ICI "
            f"{c.data_ici_axis_size}), model {c.model_axis_size}; {c.num_slices} slice(s) of "
            f"{c.num_devices_per_slice} device(s)")  # fmt: skip
