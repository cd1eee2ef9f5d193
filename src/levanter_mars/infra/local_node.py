"""The environment of the local engine's Ray nodes and clients (see local_cluster.py). Import-light: the host task
uses it, and the launcher before it imports Ray."""

import os
import tempfile

# Each node poses as one worker of a v4 slice with as many hosts as a slice of the local pod has, through the
# variables Ray reads on GKE, so Levanter's scheduler runs unchanged and neither Ray nor Levanter asks a GCE metadata
# server anything. Ray gives worker 0 the slice's head resource and every worker the slice name as a resource: with
# several slices, each slice's nodes carry their own name, which Levanter's slice actor schedules its hosts by.
LOCAL_SLICE = "cpu"
"""``--tpu_type cpu``: the local engine."""
LOCAL_SLICE_NAME = "local-cpu"
#: Hosts of the local pod -> (the v4 slice type its nodes pose as, that slice's chip topology).
LOCAL_SLICE_SHAPES = {1: ("v4-8", "2x2x1"), 2: ("v4-16", "2x2x2"), 4: ("v4-32", "2x2x4"), 8: ("v4-64", "2x4x4")}


def slice_name(slice_id: int = 0) -> str:
    """The name (``TPU_NAME``) the nodes of slice ``slice_id`` pose under; slice 0 keeps the one-slice pod's name."""
    return LOCAL_SLICE_NAME if slice_id == 0 else f"{LOCAL_SLICE_NAME}-{slice_id}"


def node_position(node_index: int, num_hosts: int) -> tuple[int, int]:
    """(slice id, worker id) of the local pod's ``node_index``-th node: nodes are numbered slice-major, as the
    training processes are (slice ``s`` holds nodes ``s * num_hosts .. s * num_hosts + num_hosts - 1``)."""
    return divmod(node_index, num_hosts)


def node_identity(num_hosts: int = 1, worker_id: int = 0, slice_id: int = 0) -> dict[str, str]:
    poses_as, topology = LOCAL_SLICE_SHAPES[num_hosts]
    return {
        "TPU_NAME": slice_name(slice_id),
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": poses_as,
        "TPU_TOPOLOGY": topology,
    }


# Even with usage stats disabled, Ray 2.60's dashboard (UsageStatsHead) asks the Azure, GCP and AWS metadata servers
# which cloud it is on and tells https://usage-stats.ray.io that stats are disabled, once, at start. These send both
# to a closed port on this machine; Ray's own traffic is loopback and exempt from the proxy.
NO_OUTSIDE_REQUESTS = {
    "http_proxy": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}


def node_environment(num_hosts: int = 1, worker_id: int = 0, slice_id: int = 0) -> dict[str, str]:
    return {**node_identity(num_hosts, worker_id, slice_id), **NO_OUTSIDE_REQUESTS}


NODE_ENVIRONMENT = node_environment()
"""The one-host local engine's node (the ``ray start`` recipe in infra/README.md)."""


# Without it Ray 2.60 also listens on 0.0.0.0 and the machine's address, even with --node-ip-address 127.0.0.1.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
TOKEN_FILE = "auth_token"


def new_temp_dir() -> str:
    return os.path.realpath(tempfile.mkdtemp(prefix="lm-ray-"))  # short: Ray's socket paths must fit 107 bytes


def client_environment(temp_dir: str) -> dict[str, str]:
    """What a client needs in its environment, before it imports Ray, to reach the cluster in ``temp_dir``."""
    return {**LOOPBACK_ONLY, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": os.path.join(temp_dir, TOKEN_FILE)}


def without_node_environment(environ):
    """``environ`` minus what a node's environment set, and minus every ``TPU_*`` variable (Ray adds some per task):
    the training process may use the network (W&B, the HF hub) and must not think it is on a TPU. The
    ``MEGASCALE_*`` variables ``run_on_pod`` gives each slice's tasks stay: they tell the run its slice."""
    return {k: v for k, v in environ.items() if not k.startswith("TPU_") and NO_OUTSIDE_REQUESTS.get(k) != v}
