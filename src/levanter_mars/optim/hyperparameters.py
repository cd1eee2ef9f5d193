"""Range checks of the MARS family's hyperparameters, with errors that name the field the user wrote."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import jax
import numpy as np
import optax

#: optax's own alias (not an equal union): optax's tests and tools recognise a learning-rate argument by it.
ScalarOrSchedule = optax.ScalarOrSchedule
VARIANTS = ("adamw", "lion", "shampoo")


def evaluate(value: ScalarOrSchedule, count: jax.Array) -> Any:
    """A hyperparameter's value at update ``count``: schedules are called, constants returned."""
    return value(count) if callable(value) else value


class HyperparameterError(ValueError):
    """An out-of-range hyperparameter: ``"<argument> <requirement>, got <value>"``.

    :meth:`renamed` gives the same message under the name the user wrote (a config field), so that the checks live
    only where the transformation is built and configs only map names.
    """

    def __init__(self, argument: str, requirement: str, value: Any):
        self.argument, self.requirement, self.value = argument, requirement, value
        super().__init__(self.renamed(lambda name: name))

    def renamed(self, field_name: Callable[[str], str]) -> str:
        return f"{field_name(self.argument)} {self.requirement}, got {self.value!r}"


def _scalar(value: Any) -> Any:
    """A hyperparameter as the checks see it: a concrete 0-d array (``optax.inject_hyperparams`` passes arrays) as its
    float, a traced one as ``None`` (not checked); anything else as it is."""
    if isinstance(value, (jax.Array, np.ndarray)) and value.ndim == 0:
        try:
            return float(value)
        except jax.errors.ConcretizationTypeError:
            return None
    return value


class _Checker:
    """Fails on the first out-of-range value. Schedules and traced values are not checked."""

    def fail(self, name: str, requirement: str, value: Any) -> None:
        raise HyperparameterError(name, requirement, value)

    def beta(self, name: str, value: Any) -> None:
        value = _scalar(value)
        if isinstance(value, numbers.Real) and not 0.0 <= value < 1.0:
            self.fail(name, "must be in [0, 1)", value)

    def gamma(self, value: Any) -> None:
        value = _scalar(value)
        if isinstance(value, numbers.Real) and not 0.0 <= value <= 1.0:
            self.fail("gamma", "must be in [0, 1]", value)

    def non_negative(self, name: str, value: Any) -> None:
        value = _scalar(value)
        if isinstance(value, numbers.Real) and not 0.0 <= value < math.inf:
            self.fail(name, "must be >= 0 and finite", value)

    def max_grad_norm(self, value: Any) -> None:
        value = _scalar(value)
        if value is not None and not (isinstance(value, numbers.Real) and 0 < value < math.inf):
            self.fail("max_grad_norm", "must be None or > 0 and finite", value)


def validate_mars_hyperparameters(
    *, variant: str, b1: Any, b2: Any, eps: Any, gamma: Any, b1_1d: Any, b2_1d: Any, max_grad_norm: Any
) -> None:
    """Raises :class:`HyperparameterError` naming the first argument of
    :func:`~levanter_mars.optim.mars.scale_by_mars` that is out of range (schedules and traced values are not
    checked). Called once, where the transformation is built."""
    check = _Checker()
    if variant not in VARIANTS:
        check.fail("variant", f"must be one of {VARIANTS}", variant)
    for name, value in (("b1", b1), ("b2", b2), ("b1_1d", b1_1d), ("b2_1d", b2_1d)):
        check.beta(name, value)
    check.gamma(gamma)
    check.non_negative("eps", eps)
    check.max_grad_norm(max_grad_norm)


def validate_step_sizes(**values: Any) -> None:
    """Learning rates and weight decays (by argument name) must be >= 0 and finite; schedules are not checked."""
    check = _Checker()
    for name, value in values.items():
        check.non_negative(name, value)


def validate_mars_m_hyperparameters(
    *,
    b1: Any,
    gamma: Any,
    eps: Any,
    b1_adamw: Any = 0.9,
    b2_adamw: Any = 0.95,
    ns_steps: Any = 5,
    exact: bool = False,
    efficient: bool = False,
    max_grad_norm: Any = None,
) -> None:
    """Raises :class:`HyperparameterError` naming the first argument of
    :func:`~levanter_mars.optim.mars_m.scale_by_mars_m` that is out of range (see
    :func:`validate_mars_hyperparameters`)."""
    check = _Checker()
    if exact and efficient:
        check.fail("efficient", "cannot be combined with exact=True (the efficient form keeps no previous "
                   "gradient to correct with)", efficient)
    for name, value in (("b1", b1), ("b1_adamw", b1_adamw), ("b2_adamw", b2_adamw)):
        check.beta(name, value)
    if efficient and _scalar(b1) == 0.0:
        check.fail("b1", "must be > 0 with efficient=True (its buffer is scaled by (1 - b1) / b1)", b1)
    check.gamma(gamma)
    check.non_negative("eps", eps)
    if not (isinstance(ns_steps, numbers.Integral) and not isinstance(ns_steps, bool) and ns_steps >= 1):
        check.fail("ns_steps", "must be an integer >= 1", ns_steps)
    check.max_grad_norm(max_grad_norm)
