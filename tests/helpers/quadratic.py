"""The per-tensor quadratic the optimizer tests train on: f(x) = sum over leaves of 0.5 * a * (x - t)^2, and one
optimizer step on it (the loss is also handed to the optimizer as ``obj_fn``, which exact modes evaluate)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def quadratic(a, t):
    """The loss of a parameter tree, for curvature tree ``a`` and target tree ``t`` of the same structure."""

    def loss(params):
        terms = jax.tree.map(lambda x, aa, tt: jnp.sum(0.5 * aa * (x - tt) ** 2), params, a, t)
        return sum(jax.tree.leaves(terms))

    return loss


def quadratic_step(tx: optax.GradientTransformation):
    """``step(params, state, a, t) -> (params, state)``, not jitted (callers jit it, on a mesh or not)."""

    def step(params, state, a, t):
        loss = quadratic(a, t)
        updates, state = tx.update(jax.grad(loss)(params), state, params, obj_fn=loss)
        return optax.apply_updates(params, updates), state

    return step
