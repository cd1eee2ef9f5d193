r"""MARS: variance-reduced preconditioned optimization (Yuan et al., arXiv 2411.10438), as optax transformations.

For every *matrix* tensor (see :mod:`levanter_mars.optim.tensor_roles`) at step :math:`t` (counted from 1):

.. math::

    c_t &= g_t + \gamma \frac{\beta_1}{1-\beta_1} (g_t - \tilde g_{t-1}),
    \qquad c_t \leftarrow c_t / \max(1, \lVert c_t \rVert_2) \quad\text{(per tensor, per layer)} \\
    m_t &= \beta_1 m_{t-1} + (1-\beta_1) c_t

and then, by variant,

* **MARS-AdamW**: :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2) c_t^2`, direction
  :math:`m_t / \big((\sqrt{v_t}/\sqrt{1-\beta_2^t} + \epsilon)(1-\beta_1^t)\big)`;
* **MARS-Lion**: direction :math:`\operatorname{sign}(m_t)`;
* **MARS-Shampoo**: direction :math:`\mathrm{NS}_5\big(m_t/(1-\beta_1)\big)\sqrt{\max(1, \text{rows}/\text{cols})}`,
  with rows = ``Out`` axes and cols = ``In`` axes.

:math:`\tilde g_{t-1}` is zero at step 1. Afterwards it is, in *approx* mode, the previous step's gradient, and in
*exact* mode the gradient at the previous parameters :math:`x_{t-1}` on the **current** batch, taken from the
``obj_fn`` the trainer passes to ``update`` (the way Levanter's Sophia receives its loss). Exact mode stores
:math:`x_{t-1}` instead of :math:`g_{t-1}`, so it needs no more optimizer memory than approx mode.

Vector tensors (LayerNorm weights, biases) use plain AdamW on :math:`g_t` with their own betas, learning rate and
weight decay, unless ``optimize_1d``, in which case they take the MARS update too (MARS-Shampoo falls back to the
AdamW form for them). The full update applied to the parameters is
:math:`-\eta_t\,(\text{direction} + \lambda x_t)`, exactly as in the official implementation (AGI-Arena/MARS).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, NamedTuple

import chex
import haliax as hax
import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from levanter_mars.optim.newton_schulz import newton_schulz5
from levanter_mars.optim.objective import objective_gradient
from levanter_mars.optim.tensor_roles import (
    TensorRole,
    map_roles,
    per_layer,
    restore_axis_order,
    tensor_roles,
)

VARIANTS = ("adamw", "lion", "shampoo")
MARS_LABEL = "mars"
ADAMW_1D_LABEL = "adamw_1d"

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


class ScaleByMarsState(NamedTuple):
    """State of :func:`scale_by_mars`.

    Attributes:
        count: number of updates taken so far (int32 scalar).
        mu: first moment of every tensor (``mu_dtype``).
        nu: second moment where one is used (AdamW-form tensors); ``optax.MaskedNode()`` at Lion and Shampoo
            matrices.
        prev: approx mode: the previous gradient of every MARS tensor (``MaskedNode`` at AdamW-branch tensors);
            exact mode: the previous parameters of every tensor (``prev_dtype``).

    Absent buffers are ``MaskedNode`` (a pytree without leaves), so they cost nothing and checkpoint cleanly.
    """

    count: chex.Array
    mu: optax.Updates
    nu: optax.Updates
    prev: optax.Updates


class _LeafUpdate(NamedTuple):
    direction: Any
    mu: Any
    nu: Any


_ABSENT = optax.MaskedNode()


def _absent(x: Any) -> bool:
    return x is None or isinstance(x, optax.MaskedNode)


def _is_leaf_update(x: Any) -> bool:
    return isinstance(x, _LeafUpdate)


def _field(tree: Any, name: str) -> Any:
    return jax.tree.map(lambda leaf: getattr(leaf, name), tree, is_leaf=_is_leaf_update)


def _evaluate(value: ScalarOrSchedule, count: jax.Array) -> Any:
    return value(count) if callable(value) else value


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
    """Raises ``ValueError`` naming the first hyperparameter that is out of range.

    ``field_name`` maps these argument names to the names the user wrote (e.g. ``"b1" -> "optimizer.beta1"``), so
    that a config error points at the config field. Schedules and traced values are not checked.
    """
    shown = field_name or (lambda name: name)

    def fail(name: str, requirement: str, value: Any) -> None:
        raise ValueError(f"{shown(name)} {requirement}, got {value!r}")

    if variant not in VARIANTS:
        fail("variant", f"must be one of {VARIANTS}", variant)
    for name, value in (("b1", b1), ("b2", b2), ("b1_1d", b1_1d), ("b2_1d", b2_1d)):
        if isinstance(value, numbers.Real) and not 0.0 <= value < 1.0:
            fail(name, "must be in [0, 1)", value)
    if isinstance(gamma, numbers.Real) and not 0.0 <= gamma <= 1.0:
        fail("gamma", "must be in [0, 1]", gamma)
    for name, value in (
        ("eps", eps),
        ("learning_rate", learning_rate),
        ("learning_rate_1d", learning_rate_1d),
        ("weight_decay", weight_decay),
        ("weight_decay_1d", weight_decay_1d),
    ):
        if isinstance(value, numbers.Real) and not 0.0 <= value < math.inf:
            fail(name, "must be >= 0 and finite", value)
    if max_grad_norm is not None and not (isinstance(max_grad_norm, numbers.Real) and 0 < max_grad_norm < math.inf):
        fail("max_grad_norm", "must be None or > 0 and finite", max_grad_norm)


def _uses_mars(role: TensorRole, optimize_1d: bool) -> bool:
    return role.is_matrix or optimize_1d


def _uses_second_moment(role: TensorRole, variant: str, optimize_1d: bool) -> bool:
    if not _uses_mars(role, optimize_1d):
        return True  # the AdamW branch
    return variant == "adamw" or (variant == "shampoo" and not role.is_matrix)


def _adam_direction(m: jax.Array, v: jax.Array, t: jax.Array, b1: float, b2: float, eps: float) -> jax.Array:
    bias_correction1 = 1.0 - jnp.power(b1, t)
    bias_correction2 = 1.0 - jnp.power(b2, t)
    return m / ((jnp.sqrt(v) / jnp.sqrt(bias_correction2) + eps) * bias_correction1)


def _corrected_gradient(g: jax.Array, g_prev: jax.Array | None, gamma: Any, b1: float) -> jax.Array:
    """c = g + gamma * b1/(1-b1) * (g - g_prev), clipped to unit L2 norm (this tensor, this layer)."""
    if g_prev is not None:
        g = (g - g_prev) * (gamma * (b1 / (1.0 - b1))) + g
    norm = jnp.sqrt(jnp.sum(jnp.square(g)))
    return g / jnp.maximum(norm, 1.0)


def _shampoo_direction(m: jax.Array, role: TensorRole, axis_names: tuple[str, ...] | None) -> jax.Array:
    """NS5 of one layer's matrix with rows = Out axes and cols = In axes, returned in m's layout."""
    if axis_names is None:  # plain 2-D array: rows are dim 0
        permutation = (0, 1)
        rows, cols = m.shape
    else:
        assert role.rows is not None and role.cols is not None
        order = role.rows + role.cols
        if sorted(order) != sorted(axis_names):
            raise ValueError(
                f"MARS-Shampoo: a matrix with axes {axis_names} (per layer) is not rows {role.rows} x cols "
                f"{role.cols}; declare its layout with register_tensor_role_rule"
            )
        permutation = tuple(axis_names.index(name) for name in order)
        sizes = dict(zip(axis_names, m.shape))
        rows = math.prod(sizes[n] for n in role.rows)
        cols = math.prod(sizes[n] for n in role.cols)
    as_matrix = jnp.transpose(m, permutation)
    orthogonal = newton_schulz5(as_matrix.reshape(rows, cols)).reshape(as_matrix.shape)
    factor = max(1.0, rows / cols) ** 0.5
    inverse = tuple(sorted(range(len(permutation)), key=permutation.__getitem__))
    return jnp.transpose(orthogonal, inverse) * factor


def scale_by_mars(
    variant: str = "adamw",
    b1: float = 0.95,
    b2: float = 0.99,
    eps: float = 1e-8,
    gamma: ScalarOrSchedule = 0.025,
    *,
    exact: bool = False,
    optimize_1d: bool = False,
    b1_1d: float = 0.9,
    b2_1d: float = 0.95,
    max_grad_norm: float | None = None,
    mu_dtype: Any = None,
    prev_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
    r"""Rescales gradients by the MARS rule (the module docstring states the math). No learning rate, no decay.

    Args:
        variant: ``"adamw"``, ``"lion"`` or ``"shampoo"``.
        b1, b2: MARS betas (the paper uses 0.95, 0.99).
        eps: added to the AdamW denominator.
        gamma: strength of the variance-reduction correction (0.025 in the paper); a float or a schedule of
            the update count.
        exact: take :math:`\tilde g_{t-1}` as the gradient at the previous parameters on the current batch, from
            the ``obj_fn`` keyword argument of ``update``. Without ``obj_fn`` the update raises ``ValueError``.
        optimize_1d: run vector tensors through MARS too instead of the separate AdamW.
        b1_1d, b2_1d: betas of the vector tensors' AdamW.
        max_grad_norm: the global-norm clip the trainer applies to raw gradients. In exact mode the gradient at the
            previous parameters is clipped the same way, as the official trainer does. It does *not* clip the
            incoming gradient (chain ``optax.clip_by_global_norm`` for that, as :func:`mars` does).
        mu_dtype: dtype of the first moment (e.g. ``jnp.bfloat16``); ``None`` keeps the parameters' dtype.
        prev_dtype: dtype of the stored previous gradient (approx) or previous parameters (exact).

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is :class:`ScaleByMarsState`.
    """
    validate_mars_hyperparameters(
        variant=variant, b1=b1, b2=b2, eps=eps, gamma=gamma, b1_1d=b1_1d, b2_1d=b2_1d, max_grad_norm=max_grad_norm
    )
    mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)
    prev_dtype = None if prev_dtype is None else jax.dtypes.canonicalize_dtype(prev_dtype)

    def init_fn(params: optax.Params) -> ScaleByMarsState:
        roles = tensor_roles(params)
        mu = map_roles(lambda role, p: otu.tree_zeros_like(p, dtype=mu_dtype), roles, params)
        nu = map_roles(
            lambda role, p: otu.tree_zeros_like(p) if _uses_second_moment(role, variant, optimize_1d) else _ABSENT,
            roles,
            params,
        )
        if exact:
            prev = otu.tree_cast(jax.tree.map(jnp.copy, params), prev_dtype)
        else:
            prev = map_roles(
                lambda role, p: otu.tree_zeros_like(p, dtype=prev_dtype) if _uses_mars(role, optimize_1d) else _ABSENT,
                roles,
                params,
            )
        return ScaleByMarsState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu, prev=prev)

    def leaf_kernel(role: TensorRole, t: jax.Array, gamma_t: Any, g: Any, mu: Any, nu: Any, g_prev: Any):
        """One tensor of one layer: plain arrays or single-layer NamedArrays in, the same out."""
        axis_names = tuple(a.name for a in g.axes) if hax.is_named_array(g) else None

        def raw(x: Any) -> Any:
            if _absent(x):
                return None
            return x.rearrange(g.axes).array if hax.is_named_array(x) else x

        def named(x: Any, like: Any) -> Any:
            if x is None:
                return _ABSENT
            x = x.astype(raw(like).dtype)
            return hax.named(x, g.axes) if axis_names is not None else x

        g32 = raw(g).astype(jnp.float32)
        m = raw(mu).astype(jnp.float32)
        v = None if _absent(nu) else raw(nu).astype(jnp.float32)

        if not _uses_mars(role, optimize_1d):
            m = b1_1d * m + (1.0 - b1_1d) * g32
            v = b2_1d * v + (1.0 - b2_1d) * jnp.square(g32)
            direction = _adam_direction(m, v, t, b1_1d, b2_1d, eps)
        else:
            prev32 = None if _absent(g_prev) else raw(g_prev).astype(jnp.float32)
            c = _corrected_gradient(g32, prev32, gamma_t, b1)
            m = b1 * m + (1.0 - b1) * c
            if variant == "lion":
                direction = jnp.sign(m)
            elif variant == "shampoo" and role.is_matrix:
                # m * (1/(1-b1)) rather than m/(1-b1): the reference rescales this way, and NS5 amplifies last bits.
                direction = _shampoo_direction(m * (1.0 / (1.0 - b1)), role, axis_names)
            else:
                v = b2 * v + (1.0 - b2) * jnp.square(c)
                direction = _adam_direction(m, v, t, b1, b2, eps)

        return _LeafUpdate(named(direction, g), named(m, mu), named(v, nu))

    def update_fn(updates, state: ScaleByMarsState, params=None, *, obj_fn=None, **extra_args):
        del extra_args
        roles = tensor_roles(updates)
        count_inc = optax.safe_increment(state.count)
        gamma_t = _evaluate(gamma, state.count)

        if exact:
            if obj_fn is None:
                raise ValueError(
                    "MARS exact mode needs the loss of the current batch: call update(grads, state, params, "
                    "obj_fn=loss_fn), where loss_fn(params) -> scalar. Levanter's trainer passes it; with "
                    "optax directly, pass it yourself (or use exact=False)."
                )
            if params is None:
                raise ValueError("MARS exact mode needs params in update() to store the previous parameters")
            previous_params = jax.tree.map(lambda q, p: q.astype(p.dtype), state.prev, params)
            previous_grads = objective_gradient(obj_fn, previous_params)
            if max_grad_norm is not None:
                previous_grads, _ = optax.clip_by_global_norm(max_grad_norm).update(
                    previous_grads, optax.EmptyState()
                )
            # The official code starts from a zero previous gradient in both modes.
            first_step = state.count == 0
            previous_grads = jax.tree.map(lambda x: jnp.where(first_step, jnp.zeros_like(x), x), previous_grads)
            previous_grads = map_roles(
                lambda role, g: g if _uses_mars(role, optimize_1d) else _ABSENT, roles, previous_grads
            )
        else:
            previous_grads = state.prev

        def leaf(role: TensorRole, g, mu, nu, g_prev):
            kernel = functools.partial(leaf_kernel, role, count_inc, gamma_t)
            out = per_layer(kernel, role)(g, mu, nu, g_prev)
            return _LeafUpdate(*(restore_axis_order(o, like) for o, like in zip(out, (g, mu, nu))))

        out = map_roles(leaf, roles, updates, state.mu, state.nu, previous_grads)
        directions, mu, nu = _field(out, "direction"), _field(out, "mu"), _field(out, "nu")

        if exact:
            prev = otu.tree_cast(params, prev_dtype)
        else:
            prev = map_roles(
                lambda role, g: otu.tree_cast(g, prev_dtype) if _uses_mars(role, optimize_1d) else _ABSENT,
                roles,
                updates,
            )
        return directions, ScaleByMarsState(count=count_inc, mu=mu, nu=nu, prev=prev)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def mars_param_labels(optimize_1d: bool = False) -> Callable[[optax.Params], Any]:
    """``params -> labels``: ``"mars"`` for tensors MARS updates, ``"adamw_1d"`` for the separate AdamW."""

    def labels(params: optax.Params) -> Any:
        return map_roles(
            lambda role, p: MARS_LABEL if _uses_mars(role, optimize_1d) else ADAMW_1D_LABEL,
            tensor_roles(params),
            params,
        )

    return labels


def _decay_mask(label: str, optimize_1d: bool, user_mask: Any = None) -> Callable[[optax.Params], Any]:
    """Mask of the tensors carrying ``label``, intersected with an optax-style user mask (prefix tree or callable)."""
    label_fn = mars_param_labels(optimize_1d)

    def mask(params: optax.Params) -> Any:
        labels = label_fn(params)
        if user_mask is None:
            return jax.tree.map(lambda lab: lab == label, labels)
        user = user_mask(params) if callable(user_mask) else user_mask
        return jax.tree.map(
            lambda keep, sub: jax.tree.map(lambda lab: bool(keep) and lab == label, sub),
            user,
            labels,
        )

    return mask


def _halved(learning_rate: ScalarOrSchedule) -> ScalarOrSchedule:
    if callable(learning_rate):
        return lambda count: learning_rate(count) / 2
    return learning_rate / 2


def mars(
    learning_rate: ScalarOrSchedule,
    *,
    variant: str = "adamw",
    b1: float = 0.95,
    b2: float = 0.99,
    eps: float = 1e-8,
    gamma: ScalarOrSchedule = 0.025,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    exact: bool = False,
    optimize_1d: bool = False,
    learning_rate_1d: ScalarOrSchedule | None = None,
    b1_1d: float = 0.9,
    b2_1d: float = 0.95,
    weight_decay_1d: float = 0.1,
    mu_dtype: Any = None,
    prev_dtype: Any = None,
    max_grad_norm: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    r"""The MARS optimizer (Yuan et al. 2024, arXiv 2411.10438), matching the official implementation.

    Chains :func:`scale_by_mars`, decoupled weight decay and the learning rates:

    * MARS tensors: :math:`x \leftarrow x - \eta\,(\text{direction} + \lambda x)`, with :math:`\lambda` =
      ``weight_decay`` where ``weight_decay_mask`` allows it (default: every MARS tensor);
    * AdamW-branch (vector) tensors: :math:`x \leftarrow x - \eta_{1d}\,(\text{direction} + \lambda_{1d} x)`.

    Args:
        learning_rate: :math:`\eta`, a float or an optax schedule.
        variant: ``"adamw"``, ``"lion"`` or ``"shampoo"``.
        b1, b2, eps, gamma, exact, optimize_1d, b1_1d, b2_1d, mu_dtype, prev_dtype: see :func:`scale_by_mars`.
        weight_decay: decay of MARS tensors.
        weight_decay_mask: optax-style mask (pytree prefix or callable) restricting ``weight_decay``. It only
            affects MARS tensors; vector tensors always decay with ``weight_decay_1d`` (set it to 0 to disable),
            as in the official code.
        learning_rate_1d: :math:`\eta_{1d}` of the AdamW branch; ``None`` means ``learning_rate / 2``.
        weight_decay_1d: decay of the AdamW-branch tensors.
        max_grad_norm: if set, clip raw gradients to this global norm first (the official trainer uses 1.0);
            in exact mode the previous-parameter gradient is clipped the same way.

    Returns:
        ``optax.GradientTransformationExtraArgs``. Call ``update(grads, state, params)`` in approx mode and
        ``update(grads, state, params, obj_fn=loss_fn)`` in exact mode, where ``loss_fn(params)`` is the loss of
        the current batch.
    """
    if learning_rate_1d is None:
        learning_rate_1d = _halved(learning_rate)
    validate_mars_hyperparameters(
        variant=variant,
        b1=b1,
        b2=b2,
        eps=eps,
        gamma=gamma,
        b1_1d=b1_1d,
        b2_1d=b2_1d,
        learning_rate=learning_rate,
        learning_rate_1d=learning_rate_1d,
        weight_decay=weight_decay,
        weight_decay_1d=weight_decay_1d,
        max_grad_norm=max_grad_norm,
    )
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm) if max_grad_norm is not None else optax.identity(),
        scale_by_mars(
            variant,
            b1,
            b2,
            eps,
            gamma,
            exact=exact,
            optimize_1d=optimize_1d,
            b1_1d=b1_1d,
            b2_1d=b2_1d,
            max_grad_norm=max_grad_norm,
            mu_dtype=mu_dtype,
            prev_dtype=prev_dtype,
        ),
        optax.add_decayed_weights(weight_decay, _decay_mask(MARS_LABEL, optimize_1d, weight_decay_mask)),
        optax.add_decayed_weights(weight_decay_1d, _decay_mask(ADAMW_1D_LABEL, optimize_1d)),
        optax.partition(
            {
                MARS_LABEL: optax.scale_by_learning_rate(learning_rate),
                ADAMW_1D_LABEL: optax.scale_by_learning_rate(learning_rate_1d),
            },
            mars_param_labels(optimize_1d),
        ),
    )
