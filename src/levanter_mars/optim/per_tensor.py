"""Named-axis plumbing: runs an update written for one layer of one tensor, as plain float32 arrays, on a whole tree.

A layer update is ``update(layout, g, m, v, v_max, g_prev) -> (direction, m, v, v_max, prev)`` on float32 arrays,
with ``None`` for absent buffers (``v`` where there is no second moment, ``v_max`` without AMSGrad, ``g_prev`` where
there is no previous gradient) and a
:class:`~levanter_mars.optim.update_rules.MatrixLayout` saying how the layer reads as a matrix. It never sees a
NamedArray, a layer axis or a storage dtype: :func:`map_layer_update` unwraps them, vectorizes the update over the
``Stacked`` layer axes of each tensor and stores each result in the dtype of the buffer it replaces (an output whose
buffer is absent is dropped).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import haliax as hax
import jax
import jax.numpy as jnp
import optax

from levanter_mars.optim.dimension_numbers import named_like_role
from levanter_mars.optim.tensor_roles import TensorRole, map_roles, per_layer, restore_axis_order
from levanter_mars.optim.update_rules import MatrixLayout

ABSENT = optax.MaskedNode()

LayerUpdate = Callable[..., tuple[Any, Any, Any, Any]]


class TensorUpdate(NamedTuple):
    """The results of one step, each a tree like the parameters (``ABSENT`` where a tensor has no such buffer)."""

    direction: Any
    mu: Any
    nu: Any
    nu_max: Any
    prev: Any


def is_absent(x: Any) -> bool:
    return x is None or isinstance(x, optax.MaskedNode)


def _dtype(x: Any) -> Any:
    return None if is_absent(x) else jnp.dtype(x.dtype)


def _update_one_tensor(
    update: LayerUpdate, role: TensorRole, g: Any, mu: Any, nu: Any, nu_max: Any, g_prev: Any, prev: Any
) -> TensorUpdate:
    # Storage dtypes are read outside the vmap: the outputs take the dtype of the buffer they replace.
    stored_dtypes = (_dtype(g), _dtype(mu), _dtype(nu), _dtype(nu_max), _dtype(prev))
    # A plain array declared by dimension numbers is updated as the named array its role reads, then unwrapped.
    plain = not hax.is_named_array(g)
    g, mu, nu, nu_max, g_prev = (x if is_absent(x) else named_like_role(x, role) for x in (g, mu, nu, nu_max, g_prev))

    def one_layer(g: Any, mu: Any, nu: Any, nu_max: Any, g_prev: Any) -> tuple[Any, ...]:
        axis_names = tuple(a.name for a in g.axes) if hax.is_named_array(g) else None

        def float32(x: Any) -> Any:
            if is_absent(x):
                return None
            return (x.rearrange(g.axes).array if hax.is_named_array(x) else x).astype(jnp.float32)

        def stored(x: Any, dtype: Any) -> Any:
            if dtype is None or x is None:
                return ABSENT
            x = x.astype(dtype)
            return hax.named(x, g.axes) if axis_names is not None else x

        layout = MatrixLayout(role, axis_names, float32(g).shape)
        out = update(layout, float32(g), float32(mu), float32(nu), float32(nu_max), float32(g_prev))
        return tuple(stored(x, dtype) for x, dtype in zip(out, stored_dtypes, strict=True))

    out = per_layer(one_layer, role)(g, mu, nu, nu_max, g_prev)
    out = (restore_axis_order(o, g) for o in out)
    return TensorUpdate(*(o.array if plain and hax.is_named_array(o) else o for o in out))


def map_layer_update(
    update_for: Callable[[TensorRole], LayerUpdate], roles: Any, grads: Any, mu: Any, nu: Any, nu_max: Any,
    g_prev: Any, prev: Any,
) -> TensorUpdate:
    """Runs ``update_for(role)`` on every layer of every tensor; ``prev`` is the buffer the last output replaces."""
    out = map_roles(
        lambda role, g, m, v, v_max, gp, p: _update_one_tensor(update_for(role), role, g, m, v, v_max, gp, p),
        roles, grads, mu, nu, nu_max, g_prev, prev,
    )

    def field(name: str) -> Any:
        return jax.tree.map(lambda leaf: getattr(leaf, name), out, is_leaf=lambda x: isinstance(x, TensorUpdate))

    return TensorUpdate(*(field(name) for name in TensorUpdate._fields))
