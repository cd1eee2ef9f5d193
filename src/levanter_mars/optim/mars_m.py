r"""MARS-M: MARS on matrix level (Liu et al., arXiv 2510.21800), matching the official code (AGI-Arena/MARS, ``MARS_M/``).

For every *matrix* tensor (rows = ``Out`` axes, cols = ``In`` axes, per layer; see :func:`mars_m_roles`) at step
:math:`t`, with :math:`c_t` and :math:`m_t` exactly as in MARS (:mod:`levanter_mars.optim.mars`):

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

# No `from __future__ import annotations`: the signatures' annotations are objects (optax's suite reads
# `learning_rate: optax.ScalarOrSchedule` to test schedules).
import dataclasses
from typing import Any

import haliax as hax
import jax
import optax

from levanter_mars.optim.cpu_write_order import ordered_on_cpu
from levanter_mars.optim.writes import AS_COMPUTED
from levanter_mars.optim.hyperparameters import ScalarOrSchedule, validate_mars_m_hyperparameters, validate_step_sizes
from levanter_mars.optim.mars_family import (
    ScaleByMarsState,
    begin_step,
    clipped_correction,
    initial_state,
    mars_family_step,
)
from levanter_mars.optim.dimension_numbers import (
    WeightDimensionNumbers,
    tree_of,
    warn_undeclared,
    with_dimension_numbers,
)
from levanter_mars.optim.role_queries import is_embedding_or_head
from levanter_mars.optim.tensor_roles import TensorKind, TensorRole, map_roles, tensor_roles
from levanter_mars.optim.update_rules import adam_moments, mars_m_adam_direction, moonlight_scale, orthogonalize


def _with_kind(role: TensorRole, matrix: bool, *, by_user: bool = False) -> TensorRole:
    """``role`` as a matrix or not; ``by_user``: a mask decided it, so nothing is left to warn about."""
    return dataclasses.replace(role, kind=TensorKind.MATRIX if matrix else TensorKind.VECTOR,
                               by_rule=role.by_rule or by_user)


def _unwrap(x: Any) -> Any:
    return x.array if hax.is_named_array(x) else x


def mars_m_roles(params: Any, matrix_mask: Any = None, weight_dimension_numbers: WeightDimensionNumbers = None) -> Any:
    """The :func:`~levanter_mars.optim.tensor_roles.tensor_roles` of ``params`` with MARS-M's choice of matrices.

    By default a matrix is a ``Linear`` weight (or a 2-D plain array), except the LM head
    (:func:`~levanter_mars.optim.role_queries.is_embedding_or_head`, the rule the role audit uses too): a ``Linear``
    whose ``Out`` axes include a vocabulary (an axis named ``vocab`` or the ``Vocab`` of an ``Embedding`` in
    ``params``). ``Embedding`` tables and everything else take AdamW, as the official trainer routes ``wte``, ``wpe``
    and ``lm_head``. A tensor given ``weight_dimension_numbers`` is a matrix of them (``None``: AdamW for a plain
    array); see :mod:`levanter_mars.optim.dimension_numbers`. ``matrix_mask``, an optax-style prefix tree or callable
    of bools, overrides the choice.
    """
    roles = with_dimension_numbers(tensor_roles(params), params, weight_dimension_numbers)
    if matrix_mask is not None:
        mask = tree_of(matrix_mask, params)
        # A mask built with jax.tree.map over a Haliax model holds NamedArrays of bools.
        return jax.tree.map(
            lambda keep, sub: map_roles(lambda role: _with_kind(role, bool(_unwrap(keep)), by_user=True), sub),
            mask,
            roles,
            is_leaf=hax.is_named_array,
        )
    embedding_or_head = is_embedding_or_head(roles)
    return map_roles(lambda role: _with_kind(role, role.is_matrix and not embedding_or_head(role)), roles)


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
    weight_dimension_numbers: WeightDimensionNumbers = None,
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
        roles = mars_m_roles(params, matrix_mask, weight_dimension_numbers)
        warn_undeclared(roles, params)
        return initial_state(
            params, roles, exact=exact, corrected=corrected, mu_dtype=mu_dtype,
            prev_dtype=prev_dtype, has_second_moment=lambda role: not role.is_matrix,
        )

    def update_fn(grads, state: ScaleByMarsState, params=None, *, obj_fn=None, write=AS_COMPUTED, **extra_args):
        del extra_args
        roles = mars_m_roles(grads, matrix_mask, weight_dimension_numbers)
        step = begin_step(grads, state, params, obj_fn, gamma=gamma, exact=exact, corrected=corrected, roles=roles,
                          max_grad_norm=max_grad_norm)
        t, gamma_t, clip = step.t, step.gamma, step.clip

        # One layer of one tensor, in float32: (direction, m_t, v_t, max v (MARS-M has no amsgrad: None), the
        # gradient kept as the next g~_{t-1}). Buffers are written through ``write`` (kept finite under the
        # non-finite guard), directions computed from what was written.
        def mars_m_layer(layout, g, m, v, v_max, g_prev):
            c = clipped_correction(g, g_prev, step, b1)  # c_t = Clip(g_t + gamma b1/(1-b1) (g_t - g~_{t-1}), 1)
            m = write.state(b1 * m + (1 - b1) * c, m)
            direction = moonlight_scale(layout) * orthogonalize(m, layout, ns_steps)
            g_kept = ordered_on_cpu(clip, m) * g
            return direction, m, v, None, g_kept if exact else write.state(g_kept, g_prev)

        def efficient_layer(layout, g, m, v, v_max, g_prev):
            # b_t = b1 b_{t-1} + (1-gamma)(1-b1)/b1 g_t; gamma g_t + b1 b_t is m_t without the clip.
            g = clip * g
            m = write.state(b1 * m + ((1 - gamma_t) * (1 - b1) / b1) * g, m)
            return moonlight_scale(layout) * orthogonalize(gamma_t * g + b1 * m, layout, ns_steps), m, v, None, None

        def adamw_layer(layout, g, m, v, v_max, g_prev):
            m_new, v_new = adam_moments(clip * g, m, v, b1_adamw, b2_adamw)
            m, v = write.state(m_new, m), write.state(v_new, v)
            return mars_m_adam_direction(m, v, t, b1_adamw, b2_adamw, eps), m, v, None, None

        def update_for(role: TensorRole):
            if not role.is_matrix:
                return adamw_layer
            return efficient_layer if efficient else mars_m_layer

        return mars_family_step(update_for, roles, grads, state, params, step.previous, exact=exact, write=write)

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
    weight_dimension_numbers: WeightDimensionNumbers = None,
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
        weight_dimension_numbers: optax-style dimension numbers (``optax.contrib.MuonDimensionNumbers``), as optax's
            Muon takes them: a tree, prefix tree or callable; ``None`` for AdamW (see :func:`mars_m_roles`).

    Returns:
        ``optax.GradientTransformationExtraArgs``. Call ``update(grads, state, params)``, adding
        ``obj_fn=loss_fn`` in exact mode.
    """
    validate_step_sizes(learning_rate=learning_rate, weight_decay=weight_decay)
    return optax.chain(
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
            weight_dimension_numbers=weight_dimension_numbers,
        ),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
