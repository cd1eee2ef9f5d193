r"""MARS-M: MARS on matrix level (Liu et al., arXiv 2510.21800), matching the official code (AGI-Arena/MARS, ``MARS_M/``).

For every *matrix* tensor (rows = ``Out`` axes, cols = ``In`` axes, per layer; see :func:`mars_m_roles`) at step
:math:`t`, with :math:`c_t` and :math:`m_t` exactly as in MARS (:mod:`levanter_mars.optim.update_rules`):

.. math::

    c_t &= \operatorname{Clip}\Big(g_t + \gamma \frac{\beta}{1-\beta}(g_t - \tilde g_{t-1}),\ 1\Big),
    \qquad m_t = \beta m_{t-1} + (1-\beta) c_t \\
    x_{t+1} &= x_t - \eta\big(0.2\sqrt{\max(\text{rows}, \text{cols})}\ \mathrm{NS}_5(m_t) + \lambda x_t\big).

The factor :math:`0.2\sqrt{\max(\cdot)}` (Moonlight's) gives the update AdamW's RMS, so every tensor shares one
learning rate. Embeddings, the LM head and every non-matrix tensor take AdamW at that learning rate and weight decay,
with :math:`\epsilon` added to :math:`\sqrt{v_t}` before the bias correction, as the official trainer does.

**Efficient form** (official ``mars_m_efficient.py``): :math:`b_t = \beta b_{t-1} + \frac{(1-\gamma)(1-\beta)}{\beta}
g_t` and :math:`\mathrm{NS}_5(\gamma g_t + \beta b_t)`. The argument equals :math:`m_t` without the clip, so it needs
no previous gradient: its state is Muon's. With :math:`\gamma = 0` MARS-M is Moonlight's Muon (without Nesterov).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import haliax as hax
import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from levanter_mars.optim.hyperparameters import ScalarOrSchedule, evaluate, validate_mars_m_hyperparameters
from levanter_mars.optim.per_tensor import ABSENT
from levanter_mars.optim.step import ScaleByMarsState, initial_previous, mars_family_update
from levanter_mars.optim.tensor_roles import TensorKind, TensorRole, is_role, map_roles, tensor_roles
from levanter_mars.optim.update_rules import (
    MatrixLayout,
    adam,
    adamw_direction,
    clip_to_unit_norm,
    corrected_gradient,
    momentum,
    orthogonalize,
)

#: Axis names of an output vocabulary; an ``Embedding``'s ``Vocab`` axes count too.
VOCAB_AXIS_NAMES = frozenset({"vocab"})


def moonlight_scale(layout: MatrixLayout) -> float:
    """0.2 * sqrt(max(rows, cols)): matches the update's RMS to AdamW's (Moonlight, arXiv 2502.16982)."""
    return 0.2 * max(layout.rows, layout.cols) ** 0.5


def mars_m_direction(c, m, v, layout: MatrixLayout, *, b1, ns_steps):
    """MARS-M: the momentum of the clipped corrected gradient, orthogonalized and scaled."""
    m = momentum(m, c, b1)
    return moonlight_scale(layout) * orthogonalize(m, layout, ns_steps), m, v


def mars_m_efficient_direction(g, m, v, layout: MatrixLayout, *, b1, gamma, ns_steps):
    """MARS-M-efficient: m_t without the clip, rebuilt from one buffer and the current gradient."""
    m = b1 * m + ((1.0 - gamma) * (1.0 - b1) / b1) * g
    return moonlight_scale(layout) * orthogonalize(gamma * g + b1 * m, layout, ns_steps), m, v


def _with_kind(role: TensorRole, matrix: bool) -> TensorRole:
    return dataclasses.replace(role, kind=TensorKind.MATRIX if matrix else TensorKind.VECTOR)


def _unwrap(x: Any) -> Any:
    return x.array if hax.is_named_array(x) else x


def mars_m_roles(params: Any, matrix_mask: Any = None) -> Any:
    """The :func:`~levanter_mars.optim.tensor_roles.tensor_roles` of ``params`` with MARS-M's choice of matrices.

    By default a matrix is a ``Linear`` weight (or a 2-D plain array), except the LM head: a ``Linear`` whose ``Out``
    axes include a vocabulary (an axis named ``vocab`` or the ``Vocab`` of an ``Embedding`` in ``params``).
    ``Embedding`` tables and everything else take AdamW, as the official trainer routes ``wte``, ``wpe`` and
    ``lm_head``. ``matrix_mask``, an optax-style prefix tree or callable of bools, overrides the choice.
    """
    roles = tensor_roles(params)
    if matrix_mask is not None:
        mask = matrix_mask(params) if callable(matrix_mask) else matrix_mask
        # A mask built with jax.tree.map over a Haliax model holds NamedArrays of bools.
        return jax.tree.map(
            lambda keep, sub: map_roles(lambda role: _with_kind(role, bool(_unwrap(keep))), sub),
            mask,
            roles,
            is_leaf=hax.is_named_array,
        )
    vocab = set(VOCAB_AXIS_NAMES)
    for role in jax.tree.leaves(roles, is_leaf=is_role):
        if is_role(role) and role.embedding:
            vocab.update(role.rows or ())

    def is_matrix(role: TensorRole) -> bool:
        return role.is_matrix and not role.embedding and not vocab.intersection(role.rows or ())

    return map_roles(lambda role: _with_kind(role, is_matrix(role)), roles)


def scale_by_mars_m(
    b1: float = 0.95,
    gamma: ScalarOrSchedule = 0.025,
    *,
    exact: bool = False,
    efficient: bool = False,
    ns_steps: int = 5,
    b1_adamw: float = 0.9,
    b2_adamw: float = 0.95,
    eps: float = 1e-8,
    matrix_mask: Any = None,
    max_grad_norm: float | None = None,
    mu_dtype: Any = None,
    prev_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """MARS-M's directions (the module docstring states the math): no learning rate, no decay.

    The state is :class:`~levanter_mars.optim.mars.ScaleByMarsState`: ``mu`` for every tensor, ``nu`` at the AdamW
    tensors, ``prev`` the previous gradient of matrices (approx), the previous parameters (exact) or nothing
    (efficient). Arguments as in :func:`mars_m`; ``max_grad_norm`` clips the incoming gradients here, folded in as
    in :func:`~levanter_mars.optim.mars.scale_by_mars`.
    """
    validate_mars_m_hyperparameters(
        b1=b1, gamma=gamma, eps=eps, b1_adamw=b1_adamw, b2_adamw=b2_adamw, ns_steps=ns_steps, exact=exact,
        efficient=efficient, max_grad_norm=max_grad_norm,
    )
    mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)
    prev_dtype = None if prev_dtype is None else jax.dtypes.canonicalize_dtype(prev_dtype)

    def corrected(role: TensorRole) -> bool:
        return role.is_matrix and not efficient

    def init_fn(params: optax.Params) -> ScaleByMarsState:
        roles = mars_m_roles(params, matrix_mask)
        mu = map_roles(lambda role, p: otu.tree_zeros_like(p, dtype=mu_dtype), roles, params)
        nu = map_roles(lambda role, p: ABSENT if role.is_matrix else otu.tree_zeros_like(p), roles, params)
        prev = initial_previous(params, roles, exact=exact, corrected=corrected, prev_dtype=prev_dtype)
        return ScaleByMarsState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu, prev=prev)

    def rule_for(role: TensorRole, t: jax.Array, gamma_t: Any):
        if not role.is_matrix:
            return lambda g, m, v, g_prev, layout: adam(
                g, m, v, t=t, b1=b1_adamw, b2=b2_adamw, eps=eps, direction=adamw_direction
            )
        if efficient:
            return lambda g, m, v, g_prev, layout: mars_m_efficient_direction(
                g, m, v, layout, b1=b1, gamma=gamma_t, ns_steps=ns_steps
            )

        def matrix_rule(g, m, v, g_prev, layout):
            c = clip_to_unit_norm(corrected_gradient(g, g_prev, gamma_t, b1))
            return mars_m_direction(c, m, v, layout, b1=b1, ns_steps=ns_steps)

        return matrix_rule

    def update_fn(updates, state: ScaleByMarsState, params=None, *, obj_fn=None, **extra_args):
        del extra_args
        rules = functools.partial(rule_for, t=optax.safe_increment(state.count), gamma_t=evaluate(gamma, state.count))
        return mars_family_update(
            rules, mars_m_roles(updates, matrix_mask), updates, state, params, obj_fn, exact=exact,
            corrected=corrected, max_grad_norm=max_grad_norm, prev_dtype=prev_dtype,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def mars_m(
    learning_rate: ScalarOrSchedule,
    *,
    b1: float = 0.95,
    gamma: ScalarOrSchedule = 0.025,
    weight_decay: float = 0.0,
    exact: bool = False,
    efficient: bool = False,
    ns_steps: int = 5,
    b1_adamw: float = 0.9,
    b2_adamw: float = 0.95,
    eps: float = 1e-8,
    matrix_mask: Any = None,
    mu_dtype: Any = None,
    prev_dtype: Any = None,
    max_grad_norm: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    r"""The MARS-M optimizer (arXiv 2510.21800), matching the official implementation.

    Every tensor moves by :math:`x \leftarrow x - \eta\,(\text{direction} + \lambda x)`: one learning rate and one
    weight decay for matrices and AdamW tensors alike.

    Args:
        learning_rate: :math:`\eta`, a float or an optax schedule.
        b1: MARS-M momentum :math:`\beta` (0.95).
        gamma: strength of the variance-reduction correction (0.025); a float or a schedule. 0 gives Muon.
        weight_decay: :math:`\lambda`, for every tensor.
        exact: correct with the gradient at the previous parameters on the current batch, from the ``obj_fn``
            keyword argument of ``update`` (as :func:`levanter_mars.optim.mars` with ``exact=True``).
        efficient: the memory-efficient form: no previous-gradient buffer and no clip (state bytes equal Muon's).
            ``ValueError`` together with ``exact``.
        ns_steps: Newton-Schulz iterations.
        b1_adamw, b2_adamw, eps: the AdamW tensors' betas and epsilon.
        matrix_mask: optax-style pytree prefix or callable of bools: which tensors are matrices (see
            :func:`mars_m_roles` for the default).
        mu_dtype: dtype of the first moment; ``None`` keeps the parameters' dtype.
        prev_dtype: dtype of the stored previous gradient (approx) or previous parameters (exact).
        max_grad_norm: if set, clip raw gradients to this global norm first (the official trainer uses 1.0); in
            exact mode the previous-parameter gradient is clipped the same way.

    Returns:
        ``optax.GradientTransformationExtraArgs``. Call ``update(grads, state, params)``, adding
        ``obj_fn=loss_fn`` in exact mode.
    """
    validate_mars_m_hyperparameters(
        b1=b1, gamma=gamma, eps=eps, b1_adamw=b1_adamw, b2_adamw=b2_adamw, learning_rate=learning_rate,
        weight_decay=weight_decay, ns_steps=ns_steps, exact=exact, efficient=efficient, max_grad_norm=max_grad_norm,
    )
    return optax.chain(
        optax.identity(),  # the global clip, folded into scale_by_mars_m; kept so the state's layout is unchanged
        scale_by_mars_m(
            b1,
            gamma,
            exact=exact,
            efficient=efficient,
            ns_steps=ns_steps,
            b1_adamw=b1_adamw,
            b2_adamw=b2_adamw,
            eps=eps,
            matrix_mask=matrix_mask,
            max_grad_norm=max_grad_norm,
            mu_dtype=mu_dtype,
            prev_dtype=prev_dtype,
        ),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
