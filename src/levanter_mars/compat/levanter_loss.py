"""7. Levanter's next-token loss passes its float loss mask as ``where=`` to jnp reductions. jax 0.7 warned and cast
it to bool; jax 0.8 raises ("where must be None or a boolean array"), so every training step fails there.
:func:`boolean_loss_masks` hands Levanter's two loss functions that mask as booleans, the cast jax 0.7.2 made itself:
losses are unchanged, on every jax."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax.numpy as jnp
import levanter.models.loss as levanter_loss

#: The functions of ``levanter.models.loss`` that reduce with ``where=`` (looked up by name by its next-token losses).
MASKED_LOSSES = ("cross_entropy_and_logsumexp_penalty", "fused_cross_entropy_loss_and_logsumexp_penalty")


def _boolean_where(loss: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(loss)
    def with_boolean_where(*args, where=None, **kwargs):
        if where is not None and where.dtype != jnp.bool_:
            where = where.astype(jnp.bool_)
        return loss(*args, where=where, **kwargs)

    with_boolean_where.casts_where_to_bool = True
    return with_boolean_where


def boolean_loss_masks() -> None:
    """Process-wide and idempotent: the loss is traced inside jitted steps, evals and hooks alike."""
    for name in MASKED_LOSSES:
        loss = getattr(levanter_loss, name)
        if not getattr(loss, "casts_where_to_bool", False):
            setattr(levanter_loss, name, _boolean_where(loss))
