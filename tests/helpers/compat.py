"""What several of tests/compat/'s files share: the local lm-eval task and a one-device mesh."""

import contextlib

import haliax as hax
import jax

from tests.helpers.processes import REPO

LOCAL_TASK = REPO / "tests" / "data" / "lm_eval_tasks" / "pydocs_mc.yaml"


@contextlib.contextmanager
def one_device_mesh():
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        yield
