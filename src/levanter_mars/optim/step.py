"""One update of the MARS family over a parameter tree, shared by :mod:`~levanter_mars.optim.mars` and
:mod:`~levanter_mars.optim.mars_m`: the global clip, the previous gradient, the per-tensor rules, the new buffers.

The update is memory-bound, so this module is written for the fewest parameter-sized passes over memory:

* The global-norm clip is a scalar factor that the rules multiply into the gradient as they read it, rather than a
  clipped copy of the gradient written to memory and read back (``optax.clip_by_global_norm``). Exact mode's second
  gradient is clipped (and zeroed at step 1) the same way.
* Norms are row-wise dot products (:func:`~levanter_mars.optim.update_rules.squared_norm`), which XLA reads once,
  instead of ``sum(x * x)``, which XLA:CPU writes out before reducing.
* The previous-gradient (or previous-parameter) buffer is overwritten in place only after the rules have read its
  old value: :func:`~levanter_mars.optim.per_tensor.after` makes that order a data dependency. Without it XLA cannot
  prove the order and copies the donated buffer aside, and the new value in (two parameter-sized copies per tensor,
  and twice the scratch memory).
* With bfloat16 buffers the tensors are updated one at a time, so the float32 scratch they need is one tensor's.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from levanter_mars.optim.objective import objective_gradient
from levanter_mars.optim.per_tensor import ABSENT, after, update_tensors
from levanter_mars.optim.tensor_roles import TensorRole, map_roles
from levanter_mars.optim.update_rules import squared_norm


class ScaleByMarsState(NamedTuple):
    """State of :func:`~levanter_mars.optim.mars.scale_by_mars` and :func:`~levanter_mars.optim.mars_m.scale_by_mars_m`.

    Attributes:
        count: number of updates taken so far (int32 scalar).
        mu: first moment of every tensor (``mu_dtype``).
        nu: second moment where one is used (AdamW-form tensors); ``optax.MaskedNode()`` elsewhere.
        prev: approx mode: the previous (globally clipped) gradient of every tensor that is corrected
            (``MaskedNode`` elsewhere); exact mode: the previous parameters of every tensor (``prev_dtype``).

    Absent buffers are ``MaskedNode`` (a pytree without leaves), so they cost nothing and checkpoint cleanly.
    """

    count: chex.Array
    mu: optax.Updates
    nu: optax.Updates
    prev: optax.Updates


def global_clip_scale(tree: Any, max_norm: Optional[float]) -> Any:
    """The factor ``optax.clip_by_global_norm(max_norm)`` multiplies every tensor of ``tree`` by (1 if None)."""
    if max_norm is None:
        return 1.0
    norm = jnp.sqrt(sum(squared_norm(x) for x in jax.tree.leaves(tree)))
    return jnp.where(norm < max_norm, 1.0, max_norm / norm)


def initial_previous(
    params: Any, roles: Any, *, exact: bool, corrected: Callable[[TensorRole], bool], prev_dtype: Any
) -> Any:
    """``prev`` before the first step: the parameters (exact), else a zero previous gradient where ``corrected``."""
    if exact:
        return otu.tree_cast(jax.tree.map(jnp.copy, params), prev_dtype)
    return map_roles(
        lambda role, p: otu.tree_zeros_like(p, dtype=prev_dtype) if corrected(role) else ABSENT, roles, params
    )


def _cast_scaled(tree: Any, scale: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: (x * scale).astype(dtype or x.dtype), tree)


class PreviousGradient(NamedTuple):
    """:math:`\\tilde g_{t-1}` as the rules read it: ``gradient * scale``, with the scale folded into their reads."""

    gradient: Any
    scale: Any


def previous_gradient(
    state: ScaleByMarsState, params: Any, obj_fn: Any, *, exact: bool, corrected: Callable[[TensorRole], bool],
    roles: Any, max_grad_norm: Optional[float],
) -> PreviousGradient:
    r"""Approx: the stored previous gradient. Exact: the gradient at the previous parameters on the *current*
    batch, clipped to ``max_grad_norm`` like the raw gradient and zero at step 1, as the official trainers do."""
    if not exact:
        return PreviousGradient(state.prev, 1.0)
    if obj_fn is None:
        raise ValueError(
            "MARS exact mode needs the loss of the current batch: call update(grads, state, params, "
            "obj_fn=loss_fn), where loss_fn(params) -> scalar. Levanter's trainer passes it; with "
            "optax directly, pass it yourself (or use exact=False)."
        )
    if params is None:
        raise ValueError("MARS exact mode needs params in update() to store the previous parameters")
    previous_params = jax.tree.map(lambda q, p: q.astype(p.dtype), state.prev, params)
    grads = objective_gradient(obj_fn, previous_params)
    scale = jnp.where(state.count == 0, 0.0, global_clip_scale(grads, max_grad_norm))
    return PreviousGradient(map_roles(lambda role, g: g if corrected(role) else ABSENT, roles, grads), scale)


def mars_family_update(
    rule_for: Callable[[TensorRole], Any], roles: Any, updates: Any, state: ScaleByMarsState, params: Any, obj_fn: Any,
    *, exact: bool, corrected: Callable[[TensorRole], bool], max_grad_norm: Optional[float], prev_dtype: Any,
) -> tuple[Any, ScaleByMarsState]:
    """Runs ``rule_for(role)`` on every tensor of the globally clipped ``updates``; returns (directions, state).

    ``corrected(role)`` says which tensors take the variance-reduced gradient (and keep a previous gradient in
    approx mode; MARS-M-efficient corrects none, so it keeps none).
    """
    scale = global_clip_scale(updates, max_grad_norm)
    previous = previous_gradient(
        state, params, obj_fn, exact=exact, corrected=corrected, roles=roles, max_grad_norm=max_grad_norm
    )
    narrow_buffers = any(jnp.dtype(x.dtype).itemsize < 4 for x in jax.tree.leaves((state.mu, state.prev)))
    directions, mu, nu = update_tensors(
        rule_for, roles, updates, state.mu, state.nu, previous.gradient, scales=(scale, previous.scale),
        one_at_a_time=narrow_buffers,
    )
    if exact:
        prev = map_roles(
            lambda role, p, m, v: _cast_scaled(p, 1.0 + after(m, v, previous.scale), prev_dtype), roles, params, mu, nu
        )
    else:
        prev = map_roles(
            lambda role, g, m, v: _cast_scaled(g, scale + after(m, v), prev_dtype) if corrected(role) else ABSENT,
            roles, updates, mu, nu,
        )
    return directions, ScaleByMarsState(count=optax.safe_increment(state.count), mu=mu, nu=nu, prev=prev)
