"""Runs Levanter's eval-harness log-likelihood dispatch on a 2-device mesh, without and with the workaround of
upstream defect 13, and prints a JSON summary. Run in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=2 (tests/compat/test_lm_eval_harness.py does)."""

import json

import haliax as hax
import jax
import numpy as np
from jax.sharding import Mesh
from levanter.eval_harness import _LmEvalHarnessWorker
from levanter.models.gpt2 import Gpt2Config

from levanter_mars.compat import lm_eval_harness


def main() -> None:
    assert jax.device_count() == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
    mapping = {"batch": "data"}
    Batch, Pos = hax.Axis("batch", 2), hax.Axis("position", 16)
    config = Gpt2Config(seq_len=16, hidden_dim=16, num_layers=1, num_heads=2)
    out = {}
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping(mapping):
        model = hax.shard(config.build(hax.Axis("vocab", 32), key=jax.random.PRNGKey(0)), {})  # replicated
        worker = _LmEvalHarnessWorker(Batch, Pos, model, mapping, None, None, max_packed_segments=2)
        # Where the request packer leaves a batch: committed to the first device.
        batch = jax.device_put(worker._dummy_batch, jax.devices()[0])
        try:
            worker.dispatch_loglikelihood(batch)
            out["without"] = "ok"
        except ValueError as e:
            out["without"] = str(e)
        with lm_eval_harness.eval_harness_on_mesh():
            segments, loglikelihoods, _ = worker.dispatch_loglikelihood(batch)
        out["with"] = {"segments": segments.array.tolist(), "finite": bool(np.isfinite(loglikelihoods.array).all())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
