"""The environment of the local engine's Ray node (see local_cluster.py). Import-light: the host task uses it."""

# The node poses as worker 0 of a one-host slice of this type and name, through the variables Ray reads on GKE,
# so Levanter's scheduler runs unchanged and neither Ray nor Levanter asks a GCE metadata server anything.
LOCAL_POSES_AS = "v4-8"
LOCAL_SLICE_NAME = "local-cpu"
NODE_IDENTITY = {
    "TPU_NAME": LOCAL_SLICE_NAME,
    "TPU_WORKER_ID": "0",
    "TPU_ACCELERATOR_TYPE": LOCAL_POSES_AS,
    "TPU_TOPOLOGY": "2x2x1",
}

# Even with usage stats disabled, Ray 2.60's dashboard (UsageStatsHead) asks the Azure, GCP and AWS metadata servers
# which cloud it is on and tells https://usage-stats.ray.io that stats are disabled, once, at start. These send both
# to a closed port on this machine; Ray's own traffic is loopback and exempt from the proxy.
NO_OUTSIDE_REQUESTS = {
    "http_proxy": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}

NODE_ENVIRONMENT = {**NODE_IDENTITY, **NO_OUTSIDE_REQUESTS}


def without_node_environment(environ):
    """``environ`` minus what NODE_ENVIRONMENT set, and minus every ``TPU_*`` variable (Ray adds some per task):
    the training process may use the network (W&B, the HF hub) and must not think it is on a TPU."""
    return {k: v for k, v in environ.items() if not k.startswith("TPU_") and NODE_ENVIRONMENT.get(k) != v}
