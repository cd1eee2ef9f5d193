"""Defect 42 of the pinned Levanter, which ``levanter_mars.compat.levanter_slices`` (through ``MarsTrainerConfig``)
works around: slices of CPU processes, and how processes and devices are laid out on them. The training it makes:
tests/test_multislice.py."""

import types

import jax
import levanter.trainer
import levanter.utils.jax_utils
import pytest

from levanter_mars.compat import levanter_slices
from levanter_mars.compat.levanter_slices import SliceLayoutError, hybrid_device_mesh, slice_of_process
from levanter_mars.training.trainer import MarsTrainerConfig


def test_defect_42_levanter_counts_no_slices_of_cpu_processes_and_the_workaround_does(monkeypatch):
    """Upstream ignores the launcher's MEGASCALE_NUM_SLICES where devices carry no slice of their own, and its mesh
    drops a DCN axis of 2 without a word (one CPU process: no ``slice_index``). In a CPU pod (gloo) every device has
    slice 0 and its hybrid mesh refuses the axis instead ("Number of slices 1 must equal the product of
    dcn_mesh_shape"): either way no run has more than one slice."""
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    assert all(getattr(d, "slice_index", 0) == 0 for d in jax.devices())
    assert levanter.trainer.TrainerConfig(train_batch_size=8).num_slices == 1
    assert levanter.utils.jax_utils.create_fsdp_mesh(1, 1, 1, 2, 1).shape["replica"] == 1
    assert MarsTrainerConfig(train_batch_size=8).num_slices == 2
    monkeypatch.delenv("MEGASCALE_NUM_SLICES")
    assert MarsTrainerConfig(train_batch_size=8).num_slices == 1


def _devices(processes: int, per_process: int):
    return [types.SimpleNamespace(id=p * 1024 + d, process_index=p, platform="cpu", device_kind="cpu", slice_index=0)
            for p in range(processes) for d in range(per_process)]  # fmt: skip


def test_slices_are_groups_of_consecutive_processes_and_the_dcn_axes_run_across_them():
    """2 slices x 2 hosts x 2 devices: the DCN replica axis splits processes {0, 1} from {2, 3}; inside a slice the
    ICI data axis runs over its 4 devices in process order."""
    mesh = hybrid_device_mesh((1, 4, 1), (2, 1, 1), _devices(4, 2), slices=2)
    assert mesh.shape == (2, 4, 1)
    assert [[d.process_index for d in row.ravel()] for row in mesh] == [[0, 0, 1, 1], [2, 2, 3, 3]]
    assert [d.id for d in mesh[1].ravel()] == [2048, 2049, 3072, 3073]
    fsdp_across = hybrid_device_mesh((1, 4, 1), (1, 2, 1), _devices(4, 2), slices=2)  # Levanter's default: data_dcn
    assert [d.process_index for d in fsdp_across[0, :, 0]] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_process_count_that_is_no_whole_number_of_slices_or_a_wrong_slice_id_is_refused(monkeypatch):
    with pytest.raises(SliceLayoutError, match="3 processes cannot be 2 slices"):
        slice_of_process(0, 3, 2)
    assert [slice_of_process(p, 6, 3) for p in range(6)] == [0, 0, 1, 1, 2, 2]
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "1")
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "1")
    with pytest.raises(SliceLayoutError, match="MEGASCALE_SLICE_ID='1'"):
        levanter_slices.check_own_slice()
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "two")
    with pytest.raises(SliceLayoutError, match="MEGASCALE_NUM_SLICES='two' is not a number of slices"):
        levanter_slices.num_slices()
