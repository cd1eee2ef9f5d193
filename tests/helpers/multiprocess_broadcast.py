"""One of two processes (``python -m tests.helpers.multiprocess_broadcast PORT ID``) joined by jax.distributed, each
with 2 simulated devices: process 0 broadcasts a value with Levanter's ``broadcast_shard`` under ``jax.set_mesh``
(as the eval harness does inside the trainer), without and with compat's fix (defect 22). Prints a JSON summary."""

import json
import sys

import jax

port, process_id = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(f"127.0.0.1:{port}", 2, process_id, heartbeat_timeout_seconds=20)

import jax.numpy as jnp  # noqa: E402
import levanter.eval_harness  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

from levanter_mars.compat.lm_eval_harness import broadcasts_across_processes  # noqa: E402

mesh = Mesh(np.array(jax.devices()).reshape(1, 4, 1), ("replica", "data", "model"))


def broadcast() -> str:
    value = jnp.array(7 if process_id == 0 else 0)
    try:
        return str(levanter.eval_harness.broadcast_shard(value, PartitionSpec()).item())
    except ValueError as e:
        return str(e)


with jax.set_mesh(mesh):
    without = broadcast()
    with broadcasts_across_processes():
        fixed = broadcast()
print(json.dumps({"without": without, "with": fixed}))
