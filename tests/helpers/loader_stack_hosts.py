"""One of two processes (``python -m tests.helpers.loader_stack_hosts PORT ID``) joined by jax.distributed, each with
2 simulated devices: a batch element as a pod's host receives it on jax 0.10 (made under the trainer's mesh of every
host's devices, so replicated over all 4 and not fully addressable; each host holds its own example), stacked by
Levanter's loader under its one-CPU mesh: upstream, then with compat 35. Prints one JSON line."""

import json
import sys

import jax

port, process_id = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(f"127.0.0.1:{port}", 2, process_id, heartbeat_timeout_seconds=20)

import haliax as hax  # noqa: E402
import levanter.data.loader as loader  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402

from levanter_mars.compat import levanter_data_mesh as mesh_fix  # noqa: E402

pod = jax.make_mesh((1, 4, 1), ("replica", "data", "model"), axis_types=(AxisType.Auto,) * 3)
own = np.arange(4) + 10 * process_id
example = hax.named(jax.make_array_from_callback(own.shape, NamedSharding(pod, PartitionSpec()), lambda i: own[i]),
                    "position")


def stacked():
    try:
        with loader.local_cpu_mesh():
            out = loader.stack_tree("batch", [example, example])
    except ValueError as error:
        return str(error)
    return {"values": np.asarray(out.array).tolist(), "devices": sorted(d.id for d in out.array.devices())}


without = stacked()
mesh_fix.auto_axes_data_mesh()
print(json.dumps({"addressable": example.array.is_fully_addressable, "without": without, "with": stacked(),
                  "own": own.tolist(), "cpu": jax.local_devices(backend="cpu")[0].id}))
