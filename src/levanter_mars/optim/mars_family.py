"""What MARS and MARS-M share around their equations: the state, what a step starts from (:func:`begin_step`: the
global clip factor, the previous gradient), the clipped corrected gradient :math:`c_t` (:func:`clipped_correction`)
and the step over a tree (:func:`mars_family_step`). The equations themselves are in ``scale_by_mars(_m)``."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from levanter_mars.optim.fewer_passes import corrected_gradient_and_norm, squared_norm
from levanter_mars.optim.hyperparameters import ScalarOrSchedule, evaluate
from levanter_mars.optim.objective import objective_gradient
from levanter_mars.optim.per_tensor import ABSENT, LayerUpdate, map_layer_update
from levanter_mars.optim.tensor_roles import TensorRole, map_roles
from levanter_mars.optim.writes import AS_COMPUTED, Writes


class ScaleByMarsState(NamedTuple):
    """State of :func:`~levanter_mars.optim.mars.scale_by_mars` and :func:`~levanter_mars.optim.mars_m.scale_by_mars_m`.

    Attributes:
        count: number of updates taken so far (int32 scalar).
        mu: first moment of every tensor (``mu_dtype``).
        nu: second moment where one is used (AdamW-form tensors); ``optax.MaskedNode()`` elsewhere.
        prev: approx mode: the previous (globally clipped) gradient of every tensor that is corrected
            (``MaskedNode`` elsewhere); exact mode: the previous parameters of every tensor (``prev_dtype``).
        nu_max: with ``amsgrad``, the running maximum of ``nu`` wherever there is a ``nu``; ``MaskedNode``
            elsewhere and everywhere without it.

    Absent buffers are ``MaskedNode`` (a pytree without leaves), so they cost nothing and checkpoint cleanly: without
    ``amsgrad`` the state stores the same leaves under the same paths as before ``nu_max`` existed.
    """

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates
    prev: optax.Updates
    nu_max: optax.Updates = optax.MaskedNode()


def global_clip_scale(tree: Any, max_norm: Optional[float]) -> Any:
    """The factor ``optax.clip_by_global_norm(max_norm)`` multiplies every tensor of ``tree`` by (1 if None).

    The update multiplies it into each gradient as it reads it, so no clipped copy of the gradients is written.
    """
    if max_norm is None:
        return 1.0
    norm = jnp.sqrt(sum(squared_norm(x) for x in jax.tree.leaves(tree)))
    return jnp.where(norm < max_norm, 1.0, max_norm / norm)


def initial_state(params: Any, roles: Any, *, exact: bool, corrected: Callable[[TensorRole], bool],
                  has_second_moment: Callable[[TensorRole], bool], mu_dtype: Any, prev_dtype: Any,
                  amsgrad: bool = False) -> ScaleByMarsState:
    """Zero moments; ``prev``: the parameters (exact), else a zero previous gradient where ``corrected``."""
    mu = map_roles(lambda role, p: otu.tree_zeros_like(p, dtype=mu_dtype), roles, params)
    nu = map_roles(lambda role, p: otu.tree_zeros_like(p) if has_second_moment(role) else ABSENT, roles, params)
    # Buffers of their own, not nu's (a donated state must not hold one buffer twice).
    nu_max = map_roles(lambda role, p: otu.tree_zeros_like(p) if amsgrad and has_second_moment(role) else ABSENT,
                       roles, params)
    if exact:
        prev = otu.tree_cast(jax.tree.map(jnp.copy, params), prev_dtype)
    else:
        prev = map_roles(
            lambda role, p: otu.tree_zeros_like(p, dtype=prev_dtype) if corrected(role) else ABSENT, roles, params
        )
    return ScaleByMarsState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu, prev=prev, nu_max=nu_max)


class PreviousGradient(NamedTuple):
    r""":math:`\tilde g_{t-1}` is ``gradient * clip``: the clip factor is multiplied in as the update reads it."""

    gradient: Any
    clip: Any


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
    clip = jnp.where(state.count == 0, 0.0, global_clip_scale(grads, max_grad_norm))
    return PreviousGradient(map_roles(lambda role, g: g if corrected(role) else ABSENT, roles, grads), clip)


class StepContext(NamedTuple):
    """What every layer of one step shares."""

    t: Any
    """The step, counted from 1."""
    gamma: Any
    """The strength of the correction at this step."""
    clip: Any
    """The global clip factor of the incoming gradients (1 without ``max_grad_norm``)."""
    previous: PreviousGradient


def begin_step(
    grads: Any, state: ScaleByMarsState, params: Any, obj_fn: Any, *, gamma: ScalarOrSchedule, exact: bool,
    corrected: Callable[[TensorRole], bool], roles: Any, max_grad_norm: Optional[float],
) -> StepContext:
    """The step count, gamma at this step, the global clip factor and the previous gradient, for ``update_fn``."""
    return StepContext(
        t=optax.safe_increment(state.count),
        gamma=evaluate(gamma, state.count),
        clip=global_clip_scale(grads, max_grad_norm),
        previous=previous_gradient(state, params, obj_fn, exact=exact, corrected=corrected, roles=roles,
                                   max_grad_norm=max_grad_norm),
    )


def clipped_correction(g: jax.Array, g_prev: Any, step: StepContext, b1: float) -> jax.Array:
    r""":math:`c_t = \operatorname{Clip}(g_t + \gamma \frac{\beta_1}{1-\beta_1}(g_t - \tilde g_{t-1}), 1)` of one
    layer, from the globally clipped gradients: the corrected gradient over :math:`\max(1, \lVert c_t \rVert_2)`."""
    c, c_norm = corrected_gradient_and_norm(g, g_prev, step.gamma, b1, clips=(step.clip, step.previous.clip))
    return c * (1.0 / jnp.maximum(1.0, c_norm))  # a product, not c / max(...): XLA:CPU writes quotients out


def mars_family_step(
    update_for: Callable[[TensorRole], LayerUpdate], roles: Any, grads: Any, state: ScaleByMarsState, params: Any,
    previous: PreviousGradient, *, exact: bool, write: Writes = AS_COMPUTED,
) -> tuple[Any, ScaleByMarsState]:
    """Runs ``update_for(role)`` on every layer of every tensor; returns (directions, new state).

    The layer update's last output is the new previous gradient (approx); exact mode stores the parameters instead.
    The layers (``update_for``'s) write their moments, and approx the previous gradient, through ``write``: so it is
    told.
    """
    replaced_prev = map_roles(lambda role, g: ABSENT, roles, grads) if exact else state.prev
    out = map_layer_update(update_for, roles, grads, state.mu, state.nu, state.nu_max, previous.gradient,
                           replaced_prev)
    prev = jax.tree.map(lambda p, old: p.astype(old.dtype), params, state.prev) if exact else out.prev
    write.report((out.mu, out.nu, out.nu_max, () if exact else out.prev))
    return out.direction, ScaleByMarsState(count=optax.safe_increment(state.count), mu=out.mu, nu=out.nu, prev=prev,
                                           nu_max=out.nu_max)


def update_form(variant: str, is_matrix: bool) -> str:
    """The variant whose rule a MARS tensor takes: its own, but MARS-Shampoo's vectors (``optimize_1d``) take
    MARS-AdamW's, since Newton-Schulz orthogonalizes matrices only. The role audit reports what this says."""
    return "adamw" if variant == "shampoo" and not is_matrix else variant
