"""The loss-of-the-current-batch hook that exact MARS (like Levanter's Sophia) receives from the trainer."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import optax


@runtime_checkable
class DifferentiableObjective(Protocol):
    """An ``obj_fn`` that can also return its own gradient, e.g. microbatched like the trainer's main gradient."""

    def __call__(self, params: Any) -> Any: ...

    def value_and_grad(self, params: Any) -> tuple[Any, Any]: ...


def _as_scalar(value: Any) -> Any:
    return value.scalar() if hax.is_named_array(value) else value


def objective_gradient(obj_fn: Callable[[Any], Any], params: Any) -> Any:
    """Gradient of ``obj_fn`` at ``params``, structured like ``params``.

    ``obj_fn(params)`` must take only the parameters: the trainer closes over the batch and RNG key. If it is a
    :class:`DifferentiableObjective`, its own ``value_and_grad`` is used, which is how the training stack keeps the
    extra gradient microbatched.
    """
    if isinstance(obj_fn, DifferentiableObjective):
        return obj_fn.value_and_grad(params)[1]
    return eqx.filter_grad(lambda p: _as_scalar(obj_fn(p)))(params)


def previous_gradient(
    obj_fn: Callable[[Any], Any] | None, previous_params: Any, params: Any, count: Any, max_grad_norm: float | None
) -> Any:
    r"""Exact mode's :math:`\tilde g_{t-1}`: the gradient at the previous parameters on the *current* batch.

    It is clipped to ``max_grad_norm`` like the raw gradient, as the official trainers do, and zero at the first
    step, where the official code starts from a zero previous gradient in both modes.
    """
    if obj_fn is None:
        raise ValueError(
            "MARS exact mode needs the loss of the current batch: call update(grads, state, params, "
            "obj_fn=loss_fn), where loss_fn(params) -> scalar. Levanter's trainer passes it; with "
            "optax directly, pass it yourself (or use exact=False)."
        )
    if params is None:
        raise ValueError("MARS exact mode needs params in update() to store the previous parameters")
    previous_params = jax.tree.map(lambda q, p: q.astype(p.dtype), previous_params, params)
    grads = objective_gradient(obj_fn, previous_params)
    if max_grad_norm is not None:
        grads, _ = optax.clip_by_global_norm(max_grad_norm).update(grads, optax.EmptyState())
    first_step = count == 0
    return jax.tree.map(lambda x: jnp.where(first_step, jnp.zeros_like(x), x), grads)
