"""Range checks of the MARS family's hyperparameters, with errors that name the field the user wrote."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import jax

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]
VARIANTS = ("adamw", "lion", "shampoo")


def evaluate(value: ScalarOrSchedule, count: jax.Array) -> Any:
    """A hyperparameter's value at update ``count``: schedules are called, constants returned."""
    return value(count) if callable(value) else value


class _Checker:
    """Fails on the first out-of-range value. Schedules and traced values are not checked."""

    def __init__(self, field_name: Callable[[str], str] | None):
        self.shown = field_name or (lambda name: name)

    def fail(self, name: str, requirement: str, value: Any) -> None:
        raise ValueError(f"{self.shown(name)} {requirement}, got {value!r}")

    def beta(self, name: str, value: Any) -> None:
        if isinstance(value, numbers.Real) and not 0.0 <= value < 1.0:
            self.fail(name, "must be in [0, 1)", value)

    def gamma(self, value: Any) -> None:
        if isinstance(value, numbers.Real) and not 0.0 <= value <= 1.0:
            self.fail("gamma", "must be in [0, 1]", value)

    def non_negative(self, name: str, value: Any) -> None:
        if isinstance(value, numbers.Real) and not 0.0 <= value < math.inf:
            self.fail(name, "must be >= 0 and finite", value)

    def max_grad_norm(self, value: Any) -> None:
        if value is not None and not (isinstance(value, numbers.Real) and 0 < value < math.inf):
            self.fail("max_grad_norm", "must be None or > 0 and finite", value)


def validate_mars_hyperparameters(
    *,
    variant: str,
    b1: Any,
    b2: Any,
    eps: Any,
    gamma: Any,
    b1_1d: Any = 0.9,
    b2_1d: Any = 0.95,
    learning_rate: Any = 0.0,
    learning_rate_1d: Any = 0.0,
    weight_decay: Any = 0.0,
    weight_decay_1d: Any = 0.0,
    max_grad_norm: Any = None,
    field_name: Callable[[str], str] | None = None,
) -> None:
    """Raises ``ValueError`` naming the first MARS hyperparameter that is out of range.

    ``field_name`` maps these argument names to the names the user wrote (e.g. ``"b1" -> "optimizer.beta1"``), so
    that a config error points at the config field. Schedules and traced values are not checked.
    """
    check = _Checker(field_name)
    if variant not in VARIANTS:
        check.fail("variant", f"must be one of {VARIANTS}", variant)
    for name, value in (("b1", b1), ("b2", b2), ("b1_1d", b1_1d), ("b2_1d", b2_1d)):
        check.beta(name, value)
    check.gamma(gamma)
    for name, value in (
        ("eps", eps),
        ("learning_rate", learning_rate),
        ("learning_rate_1d", learning_rate_1d),
        ("weight_decay", weight_decay),
        ("weight_decay_1d", weight_decay_1d),
    ):
        check.non_negative(name, value)
    check.max_grad_norm(max_grad_norm)


def validate_mars_m_hyperparameters(
    *,
    b1: Any,
    gamma: Any,
    eps: Any,
    b1_adamw: Any = 0.9,
    b2_adamw: Any = 0.95,
    learning_rate: Any = 0.0,
    weight_decay: Any = 0.0,
    ns_steps: Any = 5,
    exact: bool = False,
    efficient: bool = False,
    max_grad_norm: Any = None,
    field_name: Callable[[str], str] | None = None,
) -> None:
    """Raises ``ValueError`` naming the first MARS-M hyperparameter that is out of range (see
    :func:`validate_mars_hyperparameters`)."""
    check = _Checker(field_name)
    if exact and efficient:
        check.fail("efficient", "cannot be combined with exact=True (the efficient form keeps no previous "
                   "gradient to correct with)", efficient)
    for name, value in (("b1", b1), ("b1_adamw", b1_adamw), ("b2_adamw", b2_adamw)):
        check.beta(name, value)
    if efficient and isinstance(b1, numbers.Real) and b1 == 0.0:
        check.fail("b1", "must be > 0 with efficient=True (its buffer is scaled by (1 - b1) / b1)", b1)
    check.gamma(gamma)
    for name, value in (("eps", eps), ("learning_rate", learning_rate), ("weight_decay", weight_decay)):
        check.non_negative(name, value)
    if not (isinstance(ns_steps, numbers.Integral) and not isinstance(ns_steps, bool) and ns_steps >= 1):
        check.fail("ns_steps", "must be an integer >= 1", ns_steps)
    check.max_grad_norm(max_grad_norm)
