"""35. Levanter's data loader assembles each batch under ``local_cpu_mesh()``, a one-CPU mesh built with
``jax.make_mesh`` and no ``axis_types``: ``Auto`` axes on jax 0.7, ``Explicit`` from 0.9. ``hax.stack`` of
elements that carry the trainer's mesh (same names, ``Auto`` axes) then fails: "context mesh ... should match the
aval mesh". On jax 0.9 the loader's elements carry no mesh; on 0.10 they do, and no step trains.
:func:`auto_axes_data_mesh` gives the loader the mesh it was written for: the same device and names, with ``Auto``
axes."""

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


#: The modules that imported ``local_cpu_mesh`` by name (``from levanter.utils.jax_utils import local_cpu_mesh``).
USERS = (levanter_jax_utils, levanter.data.loader, levanter.data.mixture, levanter.data.packing)
UPSTREAM = levanter_jax_utils.local_cpu_mesh


@contextlib.contextmanager
def local_cpu_mesh():
    """Levanter's ``local_cpu_mesh`` with its axis types stated: ``Auto``, jax 0.7's default."""
    axes = (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL)
    with levanter_jax_utils.use_cpu_device() as cpu:
        mesh = jax.make_mesh((1, 1, 1), axes, devices=[cpu], axis_types=(AxisType.Auto,) * len(axes))
        with haliax.partitioning.set_mesh(mesh):
            yield mesh


def auto_axes_data_mesh() -> None:
    """Process-wide and idempotent."""
    for module in USERS:
        module.local_cpu_mesh = local_cpu_mesh
