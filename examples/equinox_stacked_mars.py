"""MARS on an Equinox model whose layers are stacked with ``eqx.filter_vmap``, through plain optax: no Levanter.

The stacked layers hold their weight as one plain ``[layers, in, out]`` array. Without help, MARS's plain-array rule
("two dimensions are a matrix") would send it to the 1-D AdamW branch, and warn. ``weight_dimension_numbers``, the
argument optax's Muon takes, declares it: ``MuonDimensionNumbers(reduction_axis=1, output_axis=2)`` makes each layer an
``[out, in]`` matrix of its own (per-layer clip of the corrected gradient), and the layer axis a per-tensor axis.

    python examples/equinox_stacked_mars.py [--steps 200] [--variant adamw|lion|shampoo]

Prints which branch every parameter takes and the loss as it trains a student to imitate a random teacher.
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from levanter_mars.optim import MuonDimensionNumbers, mars
from levanter_mars.optim.role_audit import audit_roles

WIDTH, LAYERS, INPUTS, BATCH = 32, 4, 8, 64


class Block(eqx.Module):
    weight: jax.Array  # [in, out], as Flax stores a Dense kernel
    bias: jax.Array

    def __init__(self, key: jax.Array):
        self.weight = jax.random.normal(key, (WIDTH, WIDTH)) / WIDTH**0.5
        self.bias = jnp.zeros(WIDTH)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + jax.nn.gelu(x @ self.weight + self.bias)


class Model(eqx.Module):
    embed: eqx.nn.Linear  # weight [out, in], as torch stores it
    blocks: Block  # every leaf stacked: weight [layers, in, out], bias [layers, out]
    readout: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k_embed, k_blocks, k_readout = jax.random.split(key, 3)
        self.embed = eqx.nn.Linear(INPUTS, WIDTH, key=k_embed)
        self.blocks = eqx.filter_vmap(Block)(jax.random.split(k_blocks, LAYERS))
        self.readout = eqx.nn.Linear(WIDTH, 1, key=k_readout)

    def __call__(self, x: jax.Array) -> jax.Array:
        blocks, static = eqx.partition(self.blocks, eqx.is_array)
        h, _ = jax.lax.scan(lambda h, block: (eqx.combine(block, static)(h), None), self.embed(x), blocks)
        return self.readout(h)[0]


def dimension_numbers(params: Model) -> Model:
    """The stacked weight: rows = out (axis 2), columns = in (axis 1), one matrix per layer (axis 0). The
    ``eqx.nn.Linear`` weights are ``[out, in]``. Biases: ``None``, the AdamW branch."""

    def declare(path, x):
        name = jax.tree_util.keystr(path)
        if name == ".blocks.weight":
            return MuonDimensionNumbers(reduction_axis=1, output_axis=2)
        if name.endswith(".weight"):
            return MuonDimensionNumbers(reduction_axis=1, output_axis=0)
        return None  # the biases, stacked ones ([layers, out]) included

    return jax.tree_util.tree_map_with_path(declare, params)


def train(steps: int = 200, variant: str = "adamw", seed: int = 0) -> list[float]:
    k_teacher, k_student, k_data = jax.random.split(jax.random.PRNGKey(seed), 3)
    teacher, model = Model(k_teacher), Model(k_student)
    params, static = eqx.partition(model, eqx.is_array)
    print(audit_roles(params, None, dimension_numbers).listing())

    tx = mars(3e-3 if variant == "lion" else 1e-2, variant=variant, weight_decay=1e-2,
              weight_dimension_numbers=dimension_numbers)
    state = tx.init(params)

    @eqx.filter_jit
    def step(params, state, x):
        def loss(params):
            predict = jax.vmap(eqx.combine(params, static))
            return jnp.mean((predict(x) - jax.vmap(teacher)(x)) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for i, key in enumerate(jax.random.split(k_data, steps)):
        params, state, value = step(params, state, jax.random.normal(key, (BATCH, INPUTS)))
        losses.append(float(value))
        if i % max(1, steps // 10) == 0 or i == steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.5f}")
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--variant", default="adamw", choices=("adamw", "lion", "shampoo"))
    args = parser.parse_args()
    train(args.steps, args.variant)
