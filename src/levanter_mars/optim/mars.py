r"""MARS: variance-reduced preconditioned optimization (Yuan et al., arXiv 2411.10438), as optax transformations.

For every *matrix* tensor (see :mod:`levanter_mars.optim.tensor_roles`) at step :math:`t` (counted from 1):

.. math::

    c_t &= g_t + \gamma \frac{\beta_1}{1-\beta_1} (g_t - \tilde g_{t-1}),
    \qquad c_t \leftarrow c_t / \max(1, \lVert c_t \rVert_2) \quad\text{(per tensor, per layer)} \\
    m_t &= \beta_1 m_{t-1} + (1-\beta_1) c_t

and then, by variant,

* **MARS-AdamW**: :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2) c_t^2`, direction
  :math:`m_t / \big((\sqrt{v_t}/\sqrt{1-\beta_2^t} + \epsilon)(1-\beta_1^t)\big)`; with ``amsgrad``,
  :math:`\hat v_t = \max(\hat v_{t-1}, v_t)` takes the place of :math:`v_t` in the direction (as in the 1-D AdamW);
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

# No `from __future__ import annotations`: the signatures' annotations are objects (optax's suite reads
# `learning_rate: optax.ScalarOrSchedule` to test schedules).
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from levanter_mars.optim.cpu_write_order import ordered_on_cpu
from levanter_mars.optim.writes import AS_COMPUTED
from levanter_mars.optim.hyperparameters import ScalarOrSchedule, validate_mars_hyperparameters, validate_step_sizes
from levanter_mars.optim.mars_family import (
    ScaleByMarsState,
    begin_step,
    clipped_correction,
    initial_state,
    mars_family_step,
    update_form,
)
from levanter_mars.optim.dimension_numbers import WeightDimensionNumbers, warn_undeclared, with_dimension_numbers
from levanter_mars.optim.tensor_roles import TensorRole, map_roles, tensor_roles
from levanter_mars.optim.update_rules import (
    adam_moments,
    mars_adam_direction,
    orthogonalize,
    shampoo_scale,
    written_amsgrad,
)

MARS_LABEL = "mars"
ADAMW_1D_LABEL = "adamw_1d"


def _uses_mars(role: TensorRole, optimize_1d: bool) -> bool:
    return role.is_matrix or optimize_1d


def _uses_second_moment(role: TensorRole, variant: str, optimize_1d: bool) -> bool:
    # The 1-D AdamW branch, or MARS-AdamW's form.
    return not _uses_mars(role, optimize_1d) or update_form(variant, role.is_matrix) == "adamw"


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
    weight_dimension_numbers: WeightDimensionNumbers = None,
    amsgrad: bool = False,
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
        max_grad_norm: if set, clip the incoming gradients to this global norm, as ``optax.clip_by_global_norm``
            would (the official trainer uses 1.0), and store the clipped gradient as the previous one; in exact mode
            the gradient at the previous parameters is clipped the same way. The clip is a scalar factor applied as
            the gradient is read, so no clipped copy of the gradients is written to memory.
        mu_dtype: dtype of the first moment (e.g. ``jnp.bfloat16``); ``None`` keeps the parameters' dtype.
        prev_dtype: dtype of the stored previous gradient (approx) or previous parameters (exact).
        weight_dimension_numbers: optax-style dimension numbers (``optax.contrib.MuonDimensionNumbers``): a tree,
            prefix tree or callable of the parameters; see :mod:`levanter_mars.optim.dimension_numbers`. Each tensor
            given some is a matrix of its output (rows) x reduction (columns) axes, per slice of its other axes;
            ``None`` sends a plain array to the AdamW branch. Without them, plain 2-D arrays are ``[out, in]``
            matrices.
        amsgrad: as the reference's ``amsgrad``: the AdamW directions (MARS-AdamW's, MARS-Shampoo's vectors' with
            ``optimize_1d``, and the 1-D AdamW branch's) divide by the running maximum of the second moment. Adds
            one buffer (``nu_max``) per tensor with a second moment, and none without it.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is :class:`ScaleByMarsState`.
    """
    validate_mars_hyperparameters(
        variant=variant, b1=b1, b2=b2, eps=eps, gamma=gamma, b1_1d=b1_1d, b2_1d=b2_1d, max_grad_norm=max_grad_norm
    )
    mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)
    prev_dtype = None if prev_dtype is None else jax.dtypes.canonicalize_dtype(prev_dtype)

    def corrected(role: TensorRole) -> bool:
        return _uses_mars(role, optimize_1d)

    def roles_of(tree: Any) -> Any:
        return with_dimension_numbers(tensor_roles(tree), tree, weight_dimension_numbers)

    def init_fn(params: optax.Params) -> ScaleByMarsState:
        roles = roles_of(params)
        warn_undeclared(roles, params)
        return initial_state(
            params, roles, exact=exact, corrected=corrected, mu_dtype=mu_dtype, prev_dtype=prev_dtype,
            has_second_moment=lambda role: _uses_second_moment(role, variant, optimize_1d), amsgrad=amsgrad,
        )

    def update_fn(grads, state: ScaleByMarsState, params=None, *, obj_fn=None, write=AS_COMPUTED, **extra_args):
        del extra_args
        roles = roles_of(grads)
        step = begin_step(grads, state, params, obj_fn, gamma=gamma, exact=exact, corrected=corrected, roles=roles,
                          max_grad_norm=max_grad_norm)
        t, clip = step.t, step.clip

        # One layer of one tensor, in float32: (direction, m_t, v_t, max v (amsgrad), the gradient kept as the next
        # g~_{t-1}). Each buffer is written through ``write`` (as computed, or kept finite under the non-finite guard),
        # and the direction is computed from what was written.
        def mars_layer(layout, g, m, v, v_max, g_prev):
            c = clipped_correction(g, g_prev, step, b1)  # c_t = Clip(g_t + gamma b1/(1-b1) (g_t - g~_{t-1}), 1)
            m = write.state(b1 * m + (1 - b1) * c, m)
            form = update_form(variant, layout.role.is_matrix)
            if form == "lion":
                direction = jnp.sign(m)
            elif form == "shampoo":
                # m * (1/(1-b1)), not m/(1-b1): the reference rescales this way, and NS5 amplifies last bits.
                direction = orthogonalize(m * (1.0 / (1.0 - b1)), layout) * shampoo_scale(layout)
            else:  # MARS-AdamW, and MARS-Shampoo's vectors
                v = write.state(b2 * v + (1 - b2) * c**2, v)
                v_denominator, v_max = written_amsgrad(write, v, v_max)
                direction = mars_adam_direction(m, v_denominator, t, b1, b2, eps)
            g_kept = ordered_on_cpu(clip, m, v, v_max) * g
            return direction, m, v, v_max, g_kept if exact else write.state(g_kept, g_prev)

        def adamw_1d_layer(layout, g, m, v, v_max, g_prev):
            m_new, v_new = adam_moments(clip * g, m, v, b1_1d, b2_1d)
            m, v = write.state(m_new, m), write.state(v_new, v)
            v_denominator, v_max = written_amsgrad(write, v, v_max)
            return mars_adam_direction(m, v_denominator, t, b1_1d, b2_1d, eps), m, v, v_max, None

        def update_for(role: TensorRole):
            return mars_layer if _uses_mars(role, optimize_1d) else adamw_1d_layer

        return mars_family_step(update_for, roles, grads, state, params, step.previous, exact=exact, write=write)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def mars_param_labels(
    optimize_1d: bool = False, weight_dimension_numbers: WeightDimensionNumbers = None
) -> Callable[[optax.Params], Any]:
    """``params -> labels``: ``"mars"`` for tensors MARS updates, ``"adamw_1d"`` for the separate AdamW."""

    def labels(params: optax.Params) -> Any:
        return map_roles(
            lambda role, p: MARS_LABEL if _uses_mars(role, optimize_1d) else ADAMW_1D_LABEL,
            with_dimension_numbers(tensor_roles(params), params, weight_dimension_numbers),
            params,
        )

    return labels


def _decay_mask(
    label: str, labels: Callable[[optax.Params], Any], user_mask: Any = None
) -> Callable[[optax.Params], Any]:
    """Mask of the tensors carrying ``label``, intersected with an optax-style user mask (prefix tree or callable)."""

    def mask(params: optax.Params) -> Any:
        labels_of_params = labels(params)
        if user_mask is None:
            return jax.tree.map(lambda lab: lab == label, labels_of_params)
        user = user_mask(params) if callable(user_mask) else user_mask
        return jax.tree.map(
            lambda keep, sub: jax.tree.map(lambda lab: bool(keep) and lab == label, sub),
            user,
            labels_of_params,
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
    weight_dimension_numbers: WeightDimensionNumbers = None,
    amsgrad: bool = False,
) -> optax.GradientTransformationExtraArgs:
    r"""The MARS optimizer (Yuan et al. 2024, arXiv 2411.10438), matching the official implementation.

    Chains :func:`scale_by_mars`, decoupled weight decay and the learning rates:

    * MARS tensors: :math:`x \leftarrow x - \eta\,(\text{direction} + \lambda x)`, with :math:`\lambda` =
      ``weight_decay`` where ``weight_decay_mask`` allows it (default: every MARS tensor);
    * AdamW-branch (vector) tensors: :math:`x \leftarrow x - \eta_{1d}\,(\text{direction} + \lambda_{1d} x)`.

    Args:
        learning_rate: :math:`\eta`, a float or an optax schedule.
        variant: ``"adamw"``, ``"lion"`` or ``"shampoo"``.
        b1, b2, eps, gamma, exact, optimize_1d, b1_1d, b2_1d, mu_dtype, prev_dtype, weight_dimension_numbers,
            amsgrad: see :func:`scale_by_mars`.
        weight_decay: decay of MARS tensors.
        weight_decay_mask: optax-style mask (pytree prefix or callable) restricting ``weight_decay``. It only
            affects MARS tensors; vector tensors always decay with ``weight_decay_1d`` (set it to 0 to disable),
            as in the official code.
        learning_rate_1d: :math:`\eta_{1d}` of the AdamW branch; ``None`` means ``learning_rate / 2``.
        weight_decay_1d: decay of the AdamW-branch tensors.
        max_grad_norm: if set, clip raw gradients to this global norm first (the official trainer uses 1.0);
            in exact mode the previous-parameter gradient is clipped the same way (see :func:`scale_by_mars`).

    Returns:
        ``optax.GradientTransformationExtraArgs``. Call ``update(grads, state, params)`` in approx mode and
        ``update(grads, state, params, obj_fn=loss_fn)`` in exact mode, where ``loss_fn(params)`` is the loss of
        the current batch.
    """
    if learning_rate_1d is None:
        learning_rate_1d = _halved(learning_rate)
    validate_step_sizes(learning_rate=learning_rate, learning_rate_1d=learning_rate_1d, weight_decay=weight_decay,
                        weight_decay_1d=weight_decay_1d)
    labels = mars_param_labels(optimize_1d, weight_dimension_numbers)
    return optax.chain(
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
            weight_dimension_numbers=weight_dimension_numbers,
            amsgrad=amsgrad,
        ),
        optax.add_decayed_weights(weight_decay, _decay_mask(MARS_LABEL, labels, weight_decay_mask)),
        optax.add_decayed_weights(weight_decay_1d, _decay_mask(ADAMW_1D_LABEL, labels)),
        optax.partition(
            {
                MARS_LABEL: optax.scale_by_learning_rate(learning_rate),
                ADAMW_1D_LABEL: optax.scale_by_learning_rate(learning_rate_1d),
            },
            labels,
        ),
    )
