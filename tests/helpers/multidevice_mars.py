"""Runs MARS (or, with the argument ``mars_m``, MARS-M) on 1 device and on an 8-device FSDP x TP mesh and prints a
JSON comparison.

Run in a fresh process: XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax is imported,
which tests/test_sharding.py and tests/test_mars_m_sharding.py do.
"""

import json
import re
import sys

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from haliax.partitioning import ResourceAxis
from jax.sharding import Mesh

from levanter_mars.optim import ScaleByMarsState, mars, mars_m
from tests.helpers.quadratic import quadratic_step

MAPPING = {"embed": ResourceAxis.DATA, "mlp": ResourceAxis.MODEL, "heads": ResourceAxis.MODEL}
STEPS = int(__import__("os").environ.get("MARS_STEPS", 3))


def build_params():
    try:
        from levanter.models.gpt2 import Gpt2Config
    except ImportError:  # .ci/newest has no Levanter: a haliax model with GPT-2's sharded axes (embed, heads, mlp)
        from tests.test_mars_m_named_axes import ModelWithHead

        return eqx.filter(ModelWithHead.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    config = Gpt2Config(seq_len=16, hidden_dim=32, num_layers=2, num_heads=4)
    model = config.build(hax.Axis("vocab", 64), key=jax.random.PRNGKey(0))
    return eqx.filter(model, eqx.is_inexact_array)


def batch(params, step):
    leaves, structure = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1000 + step), 2 * len(leaves))
    a = [jnp.abs(jax.random.normal(k, x.shape)) + 0.5 for k, x in zip(keys[::2], leaves)]
    t = [jax.random.normal(k, x.shape) for k, x in zip(keys[1::2], leaves)]
    return jax.tree.unflatten(structure, a), jax.tree.unflatten(structure, t)


def run(tx, params, sharded: bool):
    if not sharded:
        step = jax.jit(quadratic_step(tx))
        state = tx.init(params)
        for i in range(STEPS):
            params, state = step(params, state, *batch(params, i))
        return params, state
    step, params, state = sharded_step(tx, params)
    for i in range(STEPS):
        params, state = step(params, state, *sharded_batch(params, i))
    return params, state


def sharded_step(tx, params):
    """The step jitted over the mesh, and the parameters and optimizer state sharded on it."""
    params = hax.shard(params, MAPPING)
    return hax.named_jit(quadratic_step(tx), axis_resources=MAPPING), params, hax.named_jit(tx.init, axis_resources=MAPPING)(params)


def sharded_batch(params, step):
    return tuple(hax.shard(x, MAPPING) for x in batch(params, step))


def gathers(tx, params) -> list[str]:
    """The all-gathers in the compiled sharded step: an elementwise update with norms needs none (a reshape of a
    tensor sharded along a minor axis, as ``jnp.vdot`` does, makes XLA gather it whole)."""
    step, params, state = sharded_step(tx, params)
    return _all_gathers(step.lower(params, state, *sharded_batch(params, 0)).compile())


def _all_gathers(compiled) -> list[str]:
    return re.findall(r"=\s+(\S+)\s+all-gather(?:-start)?\(", compiled.as_text())


def building_block_gathers() -> dict[str, list[str]]:
    """The all-gathers of the update's scalar reductions on a matrix sharded along its minor axis: a reshape there
    (``jnp.vdot``, ``ravel(x)[0]``) makes XLA gather the whole matrix onto every device."""
    from jax.sharding import NamedSharding, PartitionSpec

    from levanter_mars.optim.cpu_write_order import ordered_on_cpu
    from levanter_mars.optim.fewer_passes import corrected_gradient_and_norm, squared_norm

    mesh = Mesh(np.array(jax.devices()), ("devices",))
    w = jax.device_put(jnp.ones((256, 1024)), NamedSharding(mesh, PartitionSpec(None, "devices")))
    blocks = {
        "squared_norm": squared_norm,
        "corrected_gradient_and_norm": lambda w: corrected_gradient_and_norm(w, 2 * w, 0.025, 0.95, clips=(1.0, 1.0)),
        "ordered_on_cpu": lambda w: ordered_on_cpu(jnp.ones([]), w) * w,
    }
    return {name: _all_gathers(jax.jit(f).lower(w).compile()) for name, f in blocks.items()}


def sharding_specs(tree):
    return [x.array.sharding.spec for x in jax.tree.leaves(tree, is_leaf=hax.is_named_array) if hax.is_named_array(x)]


def specs_by_path(tree) -> dict[str, object]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=hax.is_named_array)
    return {jax.tree_util.keystr(path): x.array.sharding.spec for path, x in flat if hax.is_named_array(x)}


def buffer_sharding_mismatches(buffer, params) -> dict:
    """Leaves of an optimizer buffer (absent leaves left out) whose sharding is not their parameter's, by path; and
    how many were compared (a buffer that is absent everywhere would compare none)."""
    ours, theirs = specs_by_path(buffer), specs_by_path(params)
    mismatched = {path: (str(spec), str(theirs.get(path))) for path, spec in ours.items() if theirs.get(path) != spec}
    return {"compared": len(ours), "mismatched": mismatched}


def main():
    assert len(jax.devices()) == 8, jax.devices()
    params = build_params()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), (ResourceAxis.DATA, ResourceAxis.MODEL))
    results = {}
    family = sys.argv[1] if len(sys.argv) > 1 else "mars"
    optimizer = {"mars": mars, "mars_m": mars_m}[family]
    cases = {
        "mars": {
            "adamw": dict(variant="adamw", weight_decay=0.01),
            "adamw_exact": dict(variant="adamw", exact=True, weight_decay=0.01),
            "lion": dict(variant="lion", weight_decay=0.01),
            "shampoo": dict(variant="shampoo", weight_decay=0.01),
        },
        "mars_m": {
            "approx": dict(weight_decay=0.01),
            "exact": dict(exact=True, weight_decay=0.01),
            "efficient": dict(efficient=True, weight_decay=0.01),
        },
    }[family]
    for name, kwargs in cases.items():
        tx = optimizer(1e-2, max_grad_norm=1.0, **kwargs)
        single, _ = run(tx, params, sharded=False)
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping(MAPPING):
            multi, state = run(tx, params, sharded=True)
        diffs = [
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(float(np.max(np.abs(np.asarray(a)))), 1e-12))
            for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(multi))
        ]
        (mars_state,) = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ScaleByMarsState))
                         if isinstance(s, ScaleByMarsState)]
        param_specs = sharding_specs(multi)
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping(MAPPING):
            gathered = gathers(tx, params)
        results[name] = {
            "all_gathers": gathered,
            "max_rel_diff": max(diffs),
            "params_are_sharded": any(any(p is not None for p in spec) for spec in param_specs),
            "mu_sharded_like_params": sharding_specs(mars_state.mu) == param_specs,
            "prev_sharding": buffer_sharding_mismatches(mars_state.prev, multi),
        }
    if family == "mars":
        results["building_block_gathers"] = building_block_gathers()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
