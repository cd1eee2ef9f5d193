"""The non-finite guard every trainer wraps its optimizer in: decided by the step's inputs, enforced inside the
update's own pass.

1. **Skip a step whose inputs are not finite.** The decision is made from the incoming gradients (their global norm,
   which a clipping optimizer computes anyway) and, in exact mode, from the second gradient the loss hook returns. A
   skipped step is a no-op: zero updates, the previous state kept, counted in ``skipped_steps`` and
   ``consecutive_skips`` (the trainer stops on them per ``trainer.nonfinite``).
2. **Write nothing non-finite, ever.** Even with finite inputs an optimizer's own arithmetic can overflow. Each value
   written is selected element by element: a state value is the new one where it is finite, else the previous one;
   an update value is the new one where the parameter it is added to stays finite (``param + update``, the sum the
   trainer writes: false for a NaN/Inf update too), else zero, so the parameter keeps its previous value. The
   selects are elementwise, so they fuse into the pass that computes the value; no write waits for a reduction over
   the outputs, and nothing reads the state a second time. Every value so kept is counted once in
   ``nonfinite_outputs`` (a metric of its own): a state value kept, an update value zeroed (whether it was NaN/Inf
   or would have taken its parameter past float range); an element whose state and update were both kept counts
   twice, once per value written. Such steps are not skipped. MARS's and MARS-M's own buffers (kept finite in their
   pass, ``writes.py``) are not counted: finite whenever the step's inputs are (the correction is clipped, ``eps`` >
   0), they are never replaced on a taken step.

``optax.apply_if_finite`` and MaxText's spike guard decide from the inputs too; unlike the former, this never gives up
and applies a non-finite update after too many skips.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from levanter_mars.optim.objective import DifferentiableObjective, as_scalar
from levanter_mars.optim.writes import Writes, kept_finite, replaced, replaced_count


class NonFiniteGuardState(NamedTuple):
    """State of :func:`skip_nonfinite_updates`.

    ``hyperparams`` forwards the wrapped ``inject_hyperparams`` state's hyperparameters (so Levanter still logs
    ``optim/learning_rate`` and friends) and adds ``skipped_steps`` and ``nonfinite_outputs``, logged as
    ``optim/skipped_steps`` and ``optim/nonfinite_outputs``.
    """

    inner_state: Any
    skipped_steps: jax.Array
    consecutive_skips: jax.Array
    nonfinite_outputs: jax.Array
    """Values that would have been written NaN/Inf on a taken step and kept their previous value instead (a state
    value kept, an update value zeroed; the module docstring); a running total (float32: exact to 2**24)."""

    @property
    def hyperparams(self) -> dict[str, Any]:
        inner = getattr(self.inner_state, "hyperparams", None) or {}
        return {**inner, "skipped_steps": self.skipped_steps, "nonfinite_outputs": self.nonfinite_outputs}


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point array in ``tree`` is free of NaN/Inf (other leaves are ignored)."""
    leaves = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def finite_norm(tree: Any) -> jax.Array:
    """Whether the global norm of ``tree``'s floating-point arrays is finite: false for any NaN/Inf in them (or a norm
    past float range). The same reduction as ``optax.clip_by_global_norm``'s, so a clipping optimizer shares it."""
    leaves = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    return jnp.isfinite(optax.global_norm(leaves)) if leaves else jnp.array(True)


class _CheckedObjective:
    """The loss hook exact mode receives, reporting whether the gradient it returned was finite."""

    def __init__(self, obj_fn: Callable[[Any], Any], verdicts: list):
        self._obj_fn = obj_fn
        self._verdicts = verdicts

    def __call__(self, params: Any) -> Any:
        return self._obj_fn(params)

    def value_and_grad(self, params: Any) -> tuple[Any, Any]:
        if isinstance(self._obj_fn, DifferentiableObjective):
            value, grads = self._obj_fn.value_and_grad(params)
        else:
            value, grads = eqx.filter_value_and_grad(lambda p: as_scalar(self._obj_fn(p)))(params)
        self._verdicts.append(finite_norm(grads))
        return value, grads


def _kept_finite_tree(new: Any, old: Any, take: jax.Array, owned_ids: set[int]) -> tuple[Any, list[jax.Array]]:
    """``new`` kept finite where its optimizer did not keep it itself (``owned_ids``), and where values were replaced
    (:func:`replaced`)."""
    indicators = []

    def select(value, previous):
        if id(value) in owned_ids:
            return value
        written = kept_finite(value, previous, take)
        if eqx.is_inexact_array(value):
            indicators.append(replaced(written, value))
        return written

    return jax.tree.map(select, new, old), indicators


def _updates_kept_finite(updates: Any, params: Any, take: jax.Array) -> tuple[Any, list[jax.Array]]:
    """Each update value where ``take`` and its parameter stays finite, else zero (the parameter keeps its value), and
    1 where it was zeroed, else 0. The trainer adds the update outside the optimizer; the select tests that very sum
    (false for a NaN/Inf update too: one value zeroed, marked once). The mark reads the sum the trainer writes plus
    what was held back, ``(param + kept) + (update - kept)``: ``param + update`` again where zeroed (so not finite),
    the written sum where not. Read from the written sum, the reduction stays in the pass that writes it on XLA:TPU;
    one read from ``param + update`` alone, or comparing the two sums, moved MARS-AdamW's bf16 direction to memory
    (+2.47 passes; docs/benchmarks.md). Without ``params`` the update itself is tested."""
    leaves, treedef = jax.tree.flatten(updates)
    bases = [None] * len(leaves) if params is None else jax.tree.leaves(params)
    kept, indicators = [], []
    for u, p in zip(leaves, bases):
        if not eqx.is_inexact_array(u):
            kept.append(u)
            continue
        applied = (lambda x: x) if p is None else (lambda x: (p + x).astype(p.dtype))  # noqa: E731
        kept.append(jnp.where(take & jnp.isfinite(applied(u)), u, jnp.zeros_like(u)))
        written = applied(kept[-1])
        held_back = (written + (u - kept[-1])).astype(written.dtype)
        indicators.append(jnp.where(jnp.isfinite(held_back), 0.0, 1.0))
    return treedef.unflatten(kept), indicators


def skip_nonfinite_updates(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """Wraps ``inner`` so that a step whose inputs hold a NaN/Inf is a no-op, and no NaN/Inf is ever written (see the
    module docstring). An ``inner`` that takes a ``write`` extra argument (MARS, MARS-M) keeps its own buffers
    finite inside its pass; every other state value is kept finite here."""
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        zero = jnp.zeros([], jnp.int32)
        return NonFiniteGuardState(inner.init(params), zero, zero, jnp.zeros([], jnp.float32))

    def update_fn(updates, state: NonFiniteGuardState, params=None, **extra_args):
        verdicts = [finite_norm(updates)]
        if extra_args.get("obj_fn") is not None:
            extra_args["obj_fn"] = _CheckedObjective(extra_args["obj_fn"], verdicts)
        write = Writes(verdicts)
        new_updates, new_inner = inner.update(updates, state.inner_state, params, write=write, **extra_args)
        take = write.take
        new_inner, state_replaced = _kept_finite_tree(new_inner, state.inner_state, take, write.owned_ids)
        new_updates, updates_zeroed = _updates_kept_finite(new_updates, params, take)
        replaced_values = jnp.where(take, replaced_count(state_replaced + updates_zeroed), 0.0)
        skipped = jnp.where(take, 0, 1).astype(jnp.int32)
        return new_updates, NonFiniteGuardState(
            new_inner,
            state.skipped_steps + skipped,
            jnp.where(take, 0, state.consecutive_skips + 1).astype(jnp.int32),
            state.nonfinite_outputs + replaced_values,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
