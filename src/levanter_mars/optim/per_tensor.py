"""Named-axis plumbing: runs an update rule written for one plain-array tensor on every layer of every parameter.

An update rule is ``rule(g, m, v, g_prev, layout) -> (direction, m, v)`` on float32 arrays of one layer, with
``None`` for absent buffers (``v`` where there is no second moment, ``g_prev`` where there is no previous gradient) and
a :class:`~levanter_mars.optim.update_rules.MatrixLayout` saying how the tensor reads as a matrix. The rule never sees
a NamedArray, a layer axis, a storage dtype or the global clip: :func:`update_tensor` unwraps them, multiplies the
gradients by their clip factors as it reads them, and puts the results back.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import haliax as hax
import jax
import jax.numpy as jnp
import optax

from levanter_mars.optim.tensor_roles import TensorRole, map_roles, per_layer, restore_axis_order
from levanter_mars.optim.update_rules import MatrixLayout

ABSENT = optax.MaskedNode()

UpdateRule = Callable[..., tuple[Any, Any, Any]]


class TensorUpdate(NamedTuple):
    direction: Any
    mu: Any
    nu: Any


def is_absent(x: Any) -> bool:
    return x is None or isinstance(x, optax.MaskedNode)


def update_tensor(
    rule: UpdateRule, role: TensorRole, g: Any, mu: Any, nu: Any, g_prev: Any, scales: tuple[Any, Any] = (1.0, 1.0)
) -> TensorUpdate:
    """Applies ``rule`` to each layer of one parameter tensor (plain array or NamedArray) and its buffers.

    ``scales`` multiply ``g`` and ``g_prev`` (the global clip factors, scalars).
    """

    def one_layer(g: Any, mu: Any, nu: Any, g_prev: Any) -> TensorUpdate:
        axis_names = tuple(a.name for a in g.axes) if hax.is_named_array(g) else None

        def raw(x: Any) -> Any:
            if is_absent(x):
                return None
            return x.rearrange(g.axes).array if hax.is_named_array(x) else x

        def float32(x: Any) -> Any:
            return None if is_absent(x) else raw(x).astype(jnp.float32)

        def stored_like(x: Any, like: Any) -> Any:
            if x is None:
                return ABSENT
            x = x.astype(raw(like).dtype)
            return hax.named(x, g.axes) if axis_names is not None else x

        layout = MatrixLayout(role, axis_names, raw(g).shape)
        g_prev = None if is_absent(g_prev) else float32(g_prev) * scales[1]
        direction, m, v = rule(float32(g) * scales[0], float32(mu), float32(nu), g_prev, layout)
        return TensorUpdate(stored_like(direction, g), stored_like(m, mu), stored_like(v, nu))

    out = per_layer(one_layer, role)(g, mu, nu, g_prev)
    return TensorUpdate(*(restore_axis_order(o, like) for o, like in zip(out, (g, mu, nu))))


def after(*dependencies: Any) -> jax.Array:
    """A float32 zero that can only be computed once every array in ``dependencies`` is: ``0 * one element of each``.

    Added to a scale factor, it makes whatever that factor multiplies wait for the ``dependencies`` by a data
    dependency, the only order XLA's scheduler and copy insertion are bound by (``jax.lax.optimization_barrier`` is
    not enough: XLA:CPU expands it away first). Used to overwrite a donated buffer only after the last read of its old
    value (else XLA copies the buffer aside) and to update one tensor at a time. It is zero unless a dependency is not
    finite, and then that dependency, an output of the same step, is not finite either.
    """
    leaves = [x for x in jax.tree.leaves(dependencies) if x.size]
    # x[0, ..., 0], not ravel(x)[0]: a reshape would gather a sharded x.
    return sum((0.0 * x[(0,) * x.ndim].astype(jnp.float32) for x in leaves), jnp.zeros([], jnp.float32))


def update_tensors(
    rule_for: Callable[[TensorRole], UpdateRule], roles: Any, updates: Any, mu: Any, nu: Any, g_prev: Any,
    scales: tuple[Any, Any] = (1.0, 1.0), one_at_a_time: bool = False,
) -> TensorUpdate:
    """:func:`update_tensor` on every tensor with the rule of its role; returns the three result trees.

    ``one_at_a_time``: each tensor reads its gradient only once the previous tensor's moments are written
    (:func:`after`), so that scratch memory (the float32 working copy a bfloat16 buffer needs on XLA:CPU) is one
    tensor's, not the model's; otherwise the tensors are independent and XLA may run them side by side.
    """
    done = jnp.zeros([], jnp.float32)

    def one_tensor(role, g, m, v, p):
        nonlocal done
        out = update_tensor(rule_for(role), role, g, m, v, p, (scales[0] + done, scales[1]))
        if one_at_a_time:
            done = after(out.mu, out.nu)
        return out

    out = map_roles(one_tensor, roles, updates, mu, nu, g_prev)

    def field(name: str) -> Any:
        return jax.tree.map(lambda leaf: getattr(leaf, name), out, is_leaf=lambda x: isinstance(x, TensorUpdate))

    return TensorUpdate(field("direction"), field("mu"), field("nu"))
