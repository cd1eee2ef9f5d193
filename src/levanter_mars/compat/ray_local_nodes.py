"""Defects 23 and 49 of Ray on the local engine's nodes.

Defect 23: Ray 2.60's ``ray start --address`` refuses to add a node to a cluster while
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the one setting that keeps every listener of a node on 127.0.0.1 (without
it Ray also listens on 0.0.0.0, ``::`` and the machine's address, even with ``--node-ip-address 127.0.0.1``).

The local pod needs one Ray node per simulated host, all on 127.0.0.1. ``python -m
levanter_mars.compat.ray_local_nodes <ray start arguments>`` runs Ray's own ``ray start`` with that refusal lifted
in its own process only. The same switch also makes Ray replace a loopback head address by the machine's address
(where nothing listens), so this process keeps Ray's loopback answer for "this node's address". The node's processes
(raylet, agents) read the variable from the environment and keep to 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

# Defect 49: every Ray node links libtpu's log directory (``$TPU_LOG_DIR`` if it is a directory, else
# /tmp/tpu_logs) into its session's logs, and its log monitor forwards every file there to every job's driver. On a
# TPU VM those are the run's own libtpu logs; on a shared machine they are any process's (another user's pre-flight,
# a benchmark's compile), which then filled the local pod's log. The local engine's nodes get an empty directory of
# their own cluster's instead: nothing of the local pod loads libtpu (compat defect 48).
TPU_LOG_DIR = "TPU_LOG_DIR"


def own_tpu_log_dir(temp_dir: str) -> dict[str, str]:
    """The node environment that points Ray's link at the cluster's own (empty) directory, made here."""
    path = os.path.join(temp_dir, "tpu_logs")
    os.makedirs(path, exist_ok=True)
    return {TPU_LOG_DIR: path}


def ray_start(argv: list[str]) -> int:
    """``ray <argv>`` (argv starts with ``start``), allowed to join a cluster whose listeners are on 127.0.0.1."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray._common.network_utils import get_localhost_ip
    from ray.scripts.scripts import cli

    ray_constants.ENABLE_RAY_CLUSTER = True  # passes the refusal
    services.get_node_ip_address = lambda address=None: get_localhost_ip()  # what Ray answers with the switch off
    sys.argv = ["ray", *argv]
    return cli()


if __name__ == "__main__":
    sys.exit(ray_start(sys.argv[1:]))
