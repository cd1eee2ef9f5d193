"""The order of the update's writes on XLA:CPU: the new previous gradient is written after the new moments it
replaces buffers beside, so that XLA:CPU reuses the donated buffers instead of copying them aside.

Not a change to what the update computes: :func:`ordered_on_cpu` is its ``scale`` everywhere; only XLA:CPU sees an
extra dependency by data (``docs/benchmarks.md``, ``tests/test_update_traffic.py`` counts the copies).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _zero_after(dependencies: tuple[jax.Array, ...]) -> jax.Array:
    # x[0, ..., 0], not ravel(x)[0]: a reshape would gather a sharded x.
    return sum((0.0 * x[(0,) * x.ndim] for x in dependencies if x is not None and x.size), jnp.zeros([], jnp.float32))


def ordered_on_cpu(scale: Any, *dependencies: Any) -> Any:
    """``scale``; on XLA:CPU, ``scale + 0 * dependency[0, ..., 0]`` for each dependency. Plain form: ``scale``.

    Why: the new previous gradient (``scale * g``) replaces the donated previous-gradient buffer. On XLA:CPU, unless
    its computation depends on the new moments by data (``optimization_barrier`` does not bind it: XLA:CPU expands
    it away first), XLA cannot prove the old buffer is read before it is overwritten and copies the donated buffers
    aside. XLA:TPU needs no such help and the dependency would cost it a pass (the new previous gradient could not be
    written in the pass that writes the moments), so other platforms take the plain form
    (``jax.lax.platform_dependent``, decided as the program is lowered for its platform). The dependencies are
    outputs of the same tensor's update, so a non-finite one only marks a tensor that is already non-finite.
    """
    # Both branches in the scale's own dtype: with float64 parameters (jax_enable_x64) the zero is float64 too, and
    # platform_dependent requires its branches to agree.
    dtype = jnp.result_type(scale)
    return jax.lax.platform_dependent(
        scale, *dependencies,
        cpu=lambda s, *d: (s + _zero_after(d)).astype(dtype), default=lambda s, *d: jnp.asarray(s + 0.0, dtype),
    )
