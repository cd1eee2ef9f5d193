"""Compat 35 on two simulated devices (run as a subprocess by tests/compat/test_levanter_data_mesh.py): a batch
element that sits on every device of the trainer's mesh, as on jax 0.10, stacked by Levanter's loader under its
one-CPU mesh: without the workaround, with its Auto-axes mesh alone, and with all of it. Prints one JSON line."""

import json

import haliax as hax
import jax
import jax.numpy as jnp
import levanter.data.loader as loader
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from levanter_mars.compat import levanter_data_mesh as mesh_fix

trainer = jax.make_mesh((1, 2, 1), ("replica", "data", "model"), axis_types=(AxisType.Auto,) * 3)
example = jax.device_put(hax.named(jnp.arange(4), "position"), NamedSharding(trainer, PartitionSpec()))


def stacked() -> str:
    try:
        with loader.local_cpu_mesh():
            out = loader.stack_tree("batch", [example, example])
    except ValueError as error:
        return str(error)
    ok = bool((out.array == jnp.stack([jnp.arange(4)] * 2)).all()) and out.axes[0] == hax.Axis("batch", 2)
    return f"stacked on {sorted(d.id for d in out.array.devices())}" if ok else "wrong values"


without = stacked()
loader.local_cpu_mesh = mesh_fix.local_cpu_mesh  # the Auto-axes mesh alone: the elements still sit on two devices
mesh_only = stacked()
mesh_fix.auto_axes_data_mesh()
print(json.dumps({"devices": len(jax.devices()), "without": without, "mesh_only": mesh_only, "with": stacked()}))
