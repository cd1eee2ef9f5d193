"""How an update writes what it computes: as computed, or kept finite element by element (the non-finite guard).

An optimizer that takes a ``write`` extra argument passes each new state buffer through ``write.state(new, old)``
where it computes it, and computes its direction from what was written. Under the guard (:mod:`.guard`) the value
written is the new one where the step is taken and it is finite, else the old one: a select inside the pass that
computes it, so no second pass over the state and no raw copy kept beside the written one (the guard selecting the
outputs of MARS-AdamW afterwards made XLA:TPU split its one pass in two and keep both: 4.17 more passes on GPT-2 small,
v5e; docs/benchmarks.md). The optimizer then :meth:`Writes.report`\\ s the buffers it wrote this way, which the guard
leaves alone.
"""

from __future__ import annotations

from typing import Any, Optional

import equinox as eqx
import jax
import jax.numpy as jnp


def kept_finite(new: jax.Array, old: jax.Array, take: jax.Array) -> jax.Array:
    """``new`` where ``take`` and finite, else ``old`` (itself made finite: zero where it is not); other leaves
    (counters) ``new`` where ``take``, else ``old``."""
    if not eqx.is_inexact_array(new):
        return jnp.where(take, new, old)
    safe_old = jnp.where(jnp.isfinite(old), old, jnp.zeros_like(old)).astype(new.dtype)
    return jnp.where(take & jnp.isfinite(new), new, safe_old)


def replaced(written: jax.Array, new: jax.Array) -> jax.Array:
    """1 where ``new`` was not written, else 0, as float32: read from the value written, where XLA:TPU keeps its
    reduction in the pass that writes it (an integer count, or one read from the new values, does not fuse)."""
    return jnp.where(written != new, 1.0, 0.0)


def replaced_count(indicators: list[jax.Array]) -> jax.Array:
    """How many values ``indicators`` (1 where a value was not written, else 0, as :func:`replaced`) mark, as float32.
    Those of one shape are added before they are reduced: one reduction per shape, as XLA:TPU keeps only so many
    reductions in the pass that writes the values (one per buffer beside AdamW's moments pushed them to memory:
    docs/benchmarks.md)."""
    by_shape: dict[tuple[int, ...], jax.Array] = {}
    for x in indicators:
        by_shape[x.shape] = by_shape[x.shape] + x if x.shape in by_shape else x
    return sum((jnp.sum(x) for x in by_shape.values()), jnp.zeros([], jnp.float32))


class Writes:
    """``write`` of an update: :meth:`state` for each new buffer. Without ``verdicts``: written as computed (an
    update outside the guard). With them, the step is taken when every verdict (a boolean scalar) holds; the list may
    grow while the update runs (exact mode's second gradient is judged as it is computed, before anything is
    written)."""

    def __init__(self, verdicts: Optional[list[jax.Array]] = None):
        self._verdicts = verdicts
        self.owned_ids: set[int] = set()

    @property
    def take(self) -> Optional[jax.Array]:
        return None if self._verdicts is None else jnp.all(jnp.stack(self._verdicts))

    def state(self, new: jax.Array, old: Optional[jax.Array]) -> jax.Array:
        take = self.take
        if take is None or old is None:
            return new
        return kept_finite(new, old, take)

    def report(self, buffers: Any) -> None:
        """The optimizer wrote ``buffers`` through :meth:`state`. A buffer stored in float16 is not taken: a finite
        float32 value can overflow as it is stored, after the select, so the guard keeps it finite itself."""
        if self._verdicts is not None:
            self.owned_ids |= {id(x) for x in jax.tree.leaves(buffers) if jnp.dtype(x.dtype) != jnp.float16}


#: Writes as computed: what an update outside the guard does.
AS_COMPUTED = Writes()
