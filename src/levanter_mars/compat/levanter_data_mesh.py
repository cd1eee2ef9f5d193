"""35. Levanter's data loader stacks each batch's elements (``stack_tree``) under ``local_cpu_mesh()``, a one-CPU
mesh built with ``jax.make_mesh`` and no ``axis_types``: ``Auto`` axes on jax 0.7, ``Explicit`` from 0.9. On jax 0.10
the elements arrive carrying the trainer's mesh (``Auto`` axes, every device of it), and stacking fails: "context mesh
... should match the aval mesh" on one device, "Received incompatible devices" on several. No step trains.
:func:`auto_axes_data_mesh` gives the loader the mesh it was written for (the same device and names, with ``Auto``
axes) and puts the elements on that device before they are stacked (on a pod, this host's copy of each)."""

from __future__ import annotations

import contextlib

import haliax
import jax
import levanter.data.loader
import levanter.data.mixture
import levanter.data.packing
import levanter.utils.jax_utils as levanter_jax_utils
from haliax.partitioning import ResourceAxis
from jax.sharding import AxisType


#: The modules of the loader's path that imported ``local_cpu_mesh`` by name (``from levanter.utils.jax_utils import
#: local_cpu_mesh``). ``levanter.data._prp`` (shuffling's permutation, plain integers) and
#: ``levanter.main.export_lm_to_hf`` (not run by this stack) import it too, and stack no elements of the trainer's mesh.
USERS = (levanter_jax_utils, levanter.data.loader, levanter.data.mixture, levanter.data.packing)
UPSTREAM = levanter_jax_utils.local_cpu_mesh
UPSTREAM_STACK_TREE = levanter.data.loader.stack_tree


@contextlib.contextmanager
def local_cpu_mesh():
    """Levanter's ``local_cpu_mesh`` with its axis types stated: ``Auto``, jax 0.7's default."""
    axes = (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL)
    with levanter_jax_utils.use_cpu_device() as cpu:
        mesh = jax.make_mesh((1, 1, 1), axes, devices=[cpu], axis_types=(AxisType.Auto,) * len(axes))
        with haliax.partitioning.set_mesh(mesh):
            yield mesh


def stack_tree(batch_name, individual_datums):
    """Upstream's ``stack_tree`` of the elements as they sit on the loader's device (a no-op move where they do)."""
    cpu = jax.local_devices(backend="cpu")[0]
    return UPSTREAM_STACK_TREE(batch_name, jax.tree.map(lambda x: _on_device(x, cpu), individual_datums))


def _on_device(leaf, device):
    if not isinstance(leaf, jax.Array):
        return leaf
    if not leaf.is_fully_addressable:
        # A pod's element, replicated over the trainer's mesh of every host: this host's copy is the element (each
        # host stacks its own examples).
        if not leaf.is_fully_replicated:
            raise ValueError(f"a data element sharded across hosts ({leaf.sharding}) cannot be stacked on one host")
        leaf = leaf.addressable_data(0)
    return jax.device_put(leaf, device)


def auto_axes_data_mesh() -> None:
    """Process-wide and idempotent."""
    for module in USERS:
        module.local_cpu_mesh = local_cpu_mesh
    levanter.data.loader.stack_tree = stack_tree
