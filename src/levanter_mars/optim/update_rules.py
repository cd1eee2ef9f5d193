"""The pieces of the MARS-family updates that are more than one line: Adam's two directions, the matrix view of a
layer (rows = ``Out`` axes, cols = ``In`` axes) and its orthogonalization with the variants' scale factors."""

from __future__ import annotations

import dataclasses
import functools
import math
import jax
import jax.numpy as jnp

from levanter_mars.optim.newton_schulz import newton_schulz5
from levanter_mars.optim.tensor_roles import TensorRole
from levanter_mars.optim.writes import Writes


def adam_moments(g: jax.Array, m: jax.Array, v: jax.Array, b1: float, b2: float) -> tuple[jax.Array, jax.Array]:
    """Adam's moments of the (globally clipped) gradient: the 1-D AdamW branch of MARS and of MARS-M, whose step
    directions differ (below)."""
    return b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2


def amsgrad_denominator_moment(v: jax.Array, v_max: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
    """The second moment the denominator uses, and the new running maximum: AMSGrad's ``max(v_max, v)`` for both
    (the reference takes the max of the raw ``v`` and bias-corrects it as it would ``v``); without AMSGrad
    (``v_max`` None), ``v`` itself."""
    if v_max is None:
        return v, None
    v_max = jnp.maximum(v_max, v)
    return v_max, v_max


def written_amsgrad(write: Writes, v: jax.Array, v_max: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
    """:func:`amsgrad_denominator_moment`, the new running maximum written through ``write`` (:mod:`.writes`)."""
    if v_max is None:
        return amsgrad_denominator_moment(v, None)
    _, new_max = amsgrad_denominator_moment(v, v_max)
    new_max = write.state(new_max, v_max)
    return new_max, new_max


def mars_adam_direction(m: jax.Array, v: jax.Array, t: jax.Array, b1: float, b2: float, eps: float) -> jax.Array:
    """MARS's Adam step, eps added *after* the second-moment bias correction: m / ((sqrt(v/bc2) + eps) * bc1)."""
    bias_correction1 = 1.0 - jnp.power(b1, t)
    bias_correction2 = 1.0 - jnp.power(b2, t)
    return m / ((jnp.sqrt(v) / jnp.sqrt(bias_correction2) + eps) * bias_correction1)


def mars_m_adam_direction(m: jax.Array, v: jax.Array, t: jax.Array, b1: float, b2: float, eps: float) -> jax.Array:
    """The MARS-M trainer's Adam step, eps added *before* the bias correction: m / (sqrt(v) + eps) * sqrt(bc2)/bc1.

    (Weight decay is not part of it: the optimizers chain ``optax.add_decayed_weights`` after the direction.)
    """
    bias_correction1 = 1.0 - jnp.power(b1, t)
    bias_correction2 = 1.0 - jnp.power(b2, t)
    return m / (jnp.sqrt(v) + eps) * (jnp.sqrt(bias_correction2) / bias_correction1)


def moonlight_scale(layout: "MatrixLayout") -> float:
    """0.2 * sqrt(max(rows, cols)): matches an orthogonalized update's RMS to AdamW's (Moonlight, arXiv 2502.16982)."""
    return 0.2 * max(layout.rows, layout.cols) ** 0.5


def shampoo_scale(layout: "MatrixLayout") -> float:
    """sqrt(max(1, rows / cols)): MARS-Shampoo's factor on the orthogonalized momentum (official code)."""
    return max(1.0, layout.rows / layout.cols) ** 0.5


@dataclasses.dataclass(frozen=True)
class MatrixLayout:
    """One layer of a matrix tensor as the papers see it: rows = ``Out`` axes, cols = ``In`` axes.

    Plain arrays (``axis_names`` None) are matrices of (dim 0, dim 1). The layout is worked out on first use, so a
    tensor whose axes do not form rows x cols only fails where a direction needs the matrix.
    """

    role: TensorRole
    axis_names: tuple[str, ...] | None
    shape: tuple[int, ...]

    @functools.cached_property
    def _order(self) -> tuple[tuple[int, ...], int, int]:
        if self.axis_names is None:
            if len(self.shape) != 2:
                raise ValueError(f"a plain-array matrix must be 2-D per layer, got shape {self.shape}")
            return (0, 1), self.shape[0], self.shape[1]
        rows, cols = self.role.rows, self.role.cols
        if rows is None or cols is None or sorted(rows + cols) != sorted(self.axis_names):
            raise ValueError(
                f"a matrix with axes {self.axis_names} (per layer) is not rows {rows} x cols {cols}; declare its "
                "layout with register_tensor_role_rule"
            )
        sizes = dict(zip(self.axis_names, self.shape))
        permutation = tuple(self.axis_names.index(name) for name in rows + cols)
        return permutation, math.prod(sizes[n] for n in rows), math.prod(sizes[n] for n in cols)

    @property
    def rows(self) -> int:
        return self._order[1]

    @property
    def cols(self) -> int:
        return self._order[2]

    def to_matrix(self, x: jax.Array) -> jax.Array:
        return jnp.transpose(x, self._order[0]).reshape(self.rows, self.cols)

    def from_matrix(self, x: jax.Array) -> jax.Array:
        permutation = self._order[0]
        x = x.reshape(tuple(self.shape[i] for i in permutation))
        inverse = tuple(sorted(range(len(permutation)), key=permutation.__getitem__))
        return jnp.transpose(x, inverse)


def orthogonalize(m: jax.Array, layout: MatrixLayout, steps: int = 5) -> jax.Array:
    """Newton-Schulz of the rows x cols matrix, returned in ``m``'s layout."""
    return layout.from_matrix(newton_schulz5(layout.to_matrix(m), steps=steps))
