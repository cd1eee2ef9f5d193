"""The checks on a training config's optimizer that need it built: its hyper-parameters and schedule as it reads
them, and, in exact mode, that its chain hands the loss hook on. Part of :mod:`.validation`, which runs them."""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax

from levanter_mars.training.config import ConfigError


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_optimizer(optimizer, num_train_steps: int = 10) -> None:
    """Ranges every optimizer shares (Levanter's own configs do not check them), then the loss-hook probe."""
    for name in vars(optimizer):
        value = getattr(optimizer, name)
        if not is_number(value):
            continue
        if (name.startswith("beta") or name in ("momentum", "b1", "b2")) and not 0.0 <= value < 1.0:
            raise ConfigError(f"optimizer.{name} must be in [0, 1), got {value!r}")
        if (name.startswith("learning_rate") or name in ("weight_decay", "epsilon", "min_lr_ratio")) and not (
            0 <= value < math.inf
        ):
            raise ConfigError(f"optimizer.{name} must be >= 0 and finite, got {value!r}")
    check_schedule(optimizer, num_train_steps)
    if getattr(optimizer, "exact", False):
        check_loss_hook_reaches_optimizer(optimizer, num_train_steps)


LR_SCHEDULES = ("constant", "cosine", "linear", "inv_sqrt", "inv")
#: Levanter's schedule lengths: a fraction of the run in [0, 1], or a whole number of steps.
SCHEDULE_LENGTHS = ("warmup", "decay", "rewarmup", "cooldown", "cycle_length")


def check_schedule(optimizer, num_train_steps: int) -> None:
    """Levanter's learning-rate schedule fields, which it would otherwise reject with a bare ValueError."""
    schedule = getattr(optimizer, "lr_schedule", None)
    if isinstance(schedule, str) and schedule not in LR_SCHEDULES:
        raise ConfigError(f"optimizer.lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    for name in SCHEDULE_LENGTHS:
        value = getattr(optimizer, name, None)
        if is_number(value) and not (0 <= value <= 1 or (1 < value < math.inf and value % 1 == 0)):
            raise ConfigError(
                f"optimizer.{name} must be a fraction of the run in [0, 1] or a whole number of steps, got {value!r}"
            )
    if not hasattr(optimizer, "lr_scheduler"):
        return
    try:
        optimizer.lr_scheduler(num_train_steps)
    except ValueError as e:
        raise ConfigError(
            f"optimizer schedule (warmup, decay, cooldown, cycles, lr_schedule) does not fit "
            f"trainer.num_train_steps={num_train_steps}: {e}"
        ) from e


def check_loss_hook_reaches_optimizer(optimizer, num_train_steps: int = 10) -> None:
    """Exact MARS needs ``obj_fn``; a plain ``optax.GradientTransformation`` in a chain silently drops it."""
    import haliax as hax
    import haliax.nn as hnn

    params = hnn.Linear.init(In=hax.Axis("i", 4), Out=hax.Axis("o", 3), key=jax.random.PRNGKey(0))
    calls: list[bool] = []

    def objective(p):
        calls.append(True)
        return sum(jnp.sum(x) for x in jax.tree.leaves(p))

    # The trainer's NaN guard passes extra arguments the way optax does: only to transforms that accept them.
    # Built for the run's length: a schedule with more warmup steps than that would not build at all.
    tx = optax.with_extra_args_support(optimizer.build(num_train_steps))

    def probe():
        state = tx.init(params)
        return tx.update(params, state, params, obj_fn=objective, loss=jnp.zeros(()))

    try:
        jax.eval_shape(probe)
    except ValueError as e:
        if "obj_fn" in str(e):
            calls.clear()
        else:
            raise
    if not calls:
        raise ConfigError(
            f"optimizer.exact is true, but the optimizer built from optimizer.type={type(optimizer).__name__} never "
            "receives the loss hook (obj_fn): a plain optax.GradientTransformation in its chain drops extra "
            "arguments. Use optax.chain/inject_hyperparams/GradientTransformationExtraArgs, or exact: false."
        )
