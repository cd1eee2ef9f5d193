"""The loss-of-the-current-batch hook that exact MARS (like Levanter's Sophia) receives from the trainer."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import equinox as eqx
import haliax as hax


@runtime_checkable
class DifferentiableObjective(Protocol):
    """An ``obj_fn`` that can also return its own gradient, e.g. microbatched like the trainer's main gradient."""

    def __call__(self, params: Any) -> Any: ...

    def value_and_grad(self, params: Any) -> tuple[Any, Any]: ...


def as_scalar(value: Any) -> Any:
    return value.scalar() if hax.is_named_array(value) else value


def objective_gradient(obj_fn: Callable[[Any], Any], params: Any) -> Any:
    """Gradient of ``obj_fn`` at ``params``, structured like ``params``.

    ``obj_fn(params)`` must take only the parameters: the trainer closes over the batch and RNG key. If it is a
    :class:`DifferentiableObjective`, its own ``value_and_grad`` is used, which is how the training stack keeps the
    extra gradient microbatched.
    """
    if isinstance(obj_fn, DifferentiableObjective):
        return obj_fn.value_and_grad(params)[1]
    return eqx.filter_grad(lambda p: as_scalar(obj_fn(p)))(params)
