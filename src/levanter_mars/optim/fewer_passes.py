r"""The places where the MARS-family update is not written as the paper writes it, to read memory fewer times.

The update is memory-bound: its cost is the number of parameter-sized passes over memory that the compiled program
makes (``scripts/bench_optimizer.py --tpu`` counts them on XLA:TPU, ``docs/benchmarks.md`` has the figures). Each
function below has a plain form in its docstring, which ``tests/test_mars_fewer_passes.py`` holds it to. The order
of the update's writes on XLA:CPU, which saves copies rather than passes, is ``cpu_write_order.py``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

def squared_norm(x: jax.Array) -> jax.Array:
    """``sum(x * x)`` in float32, as dot products along the last axis, then a sum over the rest.

    Why: the dot products read ``x`` once (XLA:CPU writes ``x * x`` out before reducing it), each sums one row only
    (one dot product over a whole tensor accumulates sequentially on XLA:CPU: 12% off on a GPT-2 embedding's 38.6M
    entries), and nothing is reshaped, so a sharded ``x`` is never gathered. HIGHEST precision: a TPU's default
    one-pass bfloat16 matmul would lose the norm.
    """
    rows = jnp.einsum("...i,...i->...", x, x, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return jnp.sum(rows)


def _dot(x: jax.Array, y: jax.Array) -> jax.Array:
    rows = jnp.einsum("...i,...i->...", x, y, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return jnp.sum(rows)


def norm_from_dot_products(g: jax.Array, g_prev: jax.Array, a: Any, b: Any) -> jax.Array:
    """``||a * g + b * g_prev||_2`` from ``<g, g>``, ``<g, g_prev>`` and ``<g_prev, g_prev>``, without forming the sum.

    Plain form: ``jnp.linalg.norm(a * g + b * g_prev)``.
    """
    squared = a * a * squared_norm(g) + 2.0 * a * b * _dot(g, g_prev) + b * b * squared_norm(g_prev)
    return jnp.sqrt(jnp.maximum(squared, 0.0))


def corrected_gradient_and_norm(
    g: jax.Array, g_prev: Any, gamma: Any, beta: float, *, clips: tuple[Any, Any]
) -> tuple[jax.Array, jax.Array]:
    r"""``c = g + gamma * beta / (1 - beta) * (g - g_prev)`` of the globally clipped gradients ``clips[0] * g`` and
    ``clips[1] * g_prev``, and ``||c||_2``. ``g_prev`` None means no correction.

    Plain form: ``c`` as written, then ``squared_norm(c)``; what XLA:CPU runs. Elsewhere the norm is
    :func:`norm_from_dot_products` of ``g`` and ``g_prev`` as stored, with :math:`c = a g + b \tilde g`,
    :math:`a = s(1 + k)`, :math:`b = -s' k`, :math:`k = \gamma\beta/(1-\beta)` and the clip factors
    :math:`s, s'` in the scalars.

    Why, on XLA:TPU (GPT-2 small, one v5e chip, ``scripts/bench_optimizer.py --tpu v5e``), as libtpu 0.0.23 (jax
    0.7.2) compiled it when this was written (``docs/benchmarks/optimizer_tpu_v5e_small.json``): with this function
    the update made 12.68 parameter-sized passes over memory and no buffer copy, the reduction pass reading ``g`` and
    ``g_prev`` and writing nothing, and one pass reading ``g``, ``g_prev``, the moments and the parameters and writing
    the moments, the parameters and the new previous gradient (AdamW: 8.71). Written plainly in the update (the
    clipped gradients, then ``c``, then ``squared_norm(c)``) it made 17.03 passes and 336 MiB of buffer copies
    (measured then, not recorded): XLA:TPU wrote a parameter-sized intermediate out of the reduction pass and copied
    donated buffers. Not isolated: a variant that traced both norms and used the plain one also measured 12.68, so
    what XLA:TPU's fusion responds to may be the form of the expression rather than the dot products themselves. The
    lock's libtpu 0.0.42.1 makes 13.16 passes of the same update without the trainer's guard, 12.42 with it (AdamW
    8.71; ``docs/benchmarks/optimizer_tpu_v5e_small_lock.json``, docs/benchmarks.md); the plain form was not
    measured on it.
    XLA:CPU runs every dot product as a pass of its own (it fuses none), so there the plain form reads less.
    Accuracy: the sum cancels only where ``c`` is much shorter than ``g``; its error is about float32's epsilon times
    ``a^2 ||g||^2 + b^2 ||g_prev||^2`` (``tests/test_mars_fewer_passes.py``), which matters only for gradients whose
    per-tensor norm is thousands of times the clip's threshold of 1, far beyond a global clip at ``max_grad_norm``.
    """
    k = gamma * (beta / (1.0 - beta))
    if g_prev is None:
        return clips[0] * g, clips[0] * jnp.sqrt(squared_norm(g))
    c = (clips[0] * g - clips[1] * g_prev) * k + clips[0] * g
    a, b = clips[0] * (1.0 + k), -clips[1] * k
    norm = jax.lax.platform_dependent(
        g, g_prev, c,
        cpu=lambda g, g_prev, c: jnp.sqrt(squared_norm(c)),
        default=lambda g, g_prev, c: norm_from_dot_products(g, g_prev, a, b),
    )
    return c, norm

