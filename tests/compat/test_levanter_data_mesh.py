"""Compat defect 35: Levanter's data loader stacks batch elements under a one-CPU mesh with Explicit axes (jax >= 0.9),
while on jax 0.10 the elements carry the trainer's Auto mesh: on one device, on several, and on a pod of two hosts."""

import haliax as hax
import jax
import jax.numpy as jnp
import levanter.data.loader
import pytest
from jax.sharding import AxisType

from levanter_mars.compat import levanter_data_mesh as mesh_fix
from tests.helpers.pod import run_helper_processes

NAMES = ("replica", "data", "model")


@pytest.fixture
def upstream_loader(monkeypatch):
    """Levanter's loader names as upstream has them, put back after the test however it leaves them."""
    for module in mesh_fix.USERS:
        monkeypatch.setattr(module, "local_cpu_mesh", mesh_fix.UPSTREAM)
    monkeypatch.setattr(levanter.data.loader, "stack_tree", mesh_fix.UPSTREAM_STACK_TREE)


def test_defect_35_the_loader_mesh_has_explicit_axes_and_the_workaround_stacks(upstream_loader):
    cpu = jax.local_devices(backend="cpu")[0]
    # A batch element as the trainer's context makes it: under a mesh of the same names with Auto axes.
    with hax.partitioning.set_mesh(jax.make_mesh((1, 1, 1), NAMES, devices=[cpu], axis_types=(AxisType.Auto,) * 3)):
        example = jax.jit(lambda a: a + 1)(hax.named(jnp.arange(4), "position"))

    def stacked():
        with levanter.data.loader.local_cpu_mesh() as mesh:  # the names the loader looks up
            try:
                return mesh, levanter.data.loader.stack_tree("batch", [example, example])
            except ValueError as error:
                return mesh, error

    mesh, upstream = stacked()
    assert set(mesh.axis_types) == {AxisType.Explicit}  # jax >= 0.9 (on 0.7 make_mesh made Auto axes)
    assert isinstance(upstream, ValueError) and "should match the aval mesh" in str(upstream), upstream
    mesh_fix.auto_axes_data_mesh()
    mesh_fix.auto_axes_data_mesh()  # idempotent
    mesh, ours = stacked()
    assert set(mesh.axis_types) == {AxisType.Auto} and list(mesh.devices.flat) == [cpu] and mesh.axis_names == NAMES
    assert not isinstance(ours, Exception), ours
    assert ours.axes == (hax.Axis("batch", 2), hax.Axis("position", 4))
    assert (ours.array == jnp.stack([example.array] * 2)).all()


@pytest.mark.multidevice
def test_defect_35_on_two_devices_the_elements_must_move_to_the_loaders_device():
    (result,) = run_helper_processes("tests.helpers.loader_stack_devices", devices=2)
    assert result["devices"] == 2 and "should match the aval mesh" in result["without"], result
    assert "incompatible devices" in result["mesh_only"], result  # the Auto-axes mesh alone does not do
    assert result["with"] == "stacked on [0]", result


@pytest.mark.multidevice
def test_defect_35_on_a_pod_each_host_stacks_its_own_copy_of_the_replicated_elements():
    for result in run_helper_processes("tests.helpers.loader_stack_hosts", num_processes=2, devices=2):
        assert result["addressable"] is False and "should match the aval mesh" in result["without"], result
        assert result["with"] == {"values": [result["own"]] * 2, "devices": [result["cpu"]]}, result
