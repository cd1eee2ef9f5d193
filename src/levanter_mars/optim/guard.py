"""Skip optimizer steps whose gradients, updates or new state are not finite, and count them."""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


class NonFiniteGuardState(NamedTuple):
    """State of :func:`skip_nonfinite_updates`.

    ``hyperparams`` forwards the wrapped ``inject_hyperparams`` state's hyperparameters (so Levanter still logs
    ``optim/learning_rate`` and friends) and adds ``skipped_steps``, logged as ``optim/skipped_steps``.
    """

    inner_state: Any
    skipped_steps: jax.Array
    consecutive_skips: jax.Array

    @property
    def hyperparams(self) -> dict[str, Any]:
        inner = getattr(self.inner_state, "hyperparams", None) or {}
        return {**inner, "skipped_steps": self.skipped_steps}


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point array in ``tree`` is free of NaN/Inf (other leaves are ignored)."""
    leaves = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def skip_nonfinite_updates(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` so that a step with a NaN/Inf anywhere is a no-op.

    The step is skipped when the incoming gradients, the resulting updates or the new optimizer state contain a
    non-finite value: the updates become zero and the previous state is kept, so nothing non-finite ever reaches
    the parameters or the optimizer state (and hence a checkpoint). Checking the outputs too matters for MARS: in
    exact mode the update also depends on a second gradient that the incoming gradients do not show.

    Unlike ``optax.apply_if_finite``, this never gives up and applies a non-finite update after too many skips;
    the trainer decides whether to stop (``trainer.nonfinite``), reading ``skipped_steps`` and
    ``consecutive_skips``.
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        zero = jnp.zeros([], jnp.int32)
        return NonFiniteGuardState(inner.init(params), zero, zero)

    def update_fn(updates, state: NonFiniteGuardState, params=None, **extra_args):
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        finite = all_finite(updates) & all_finite(new_updates) & all_finite(new_inner)
        new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
        new_inner = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_inner, state.inner_state)
        skipped = jnp.where(finite, 0, 1).astype(jnp.int32)
        return new_updates, NonFiniteGuardState(
            new_inner,
            state.skipped_steps + skipped,
            jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32),
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
