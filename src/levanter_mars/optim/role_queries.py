"""What MARS-M, the optimizers' ``init`` and the role audit ask of a tree of roles: which tensors are an embedding or
the LM head (one rule for all of them), which would take the 1-D branch silently, and every tensor with its role."""

from __future__ import annotations

from typing import Any, Callable

import haliax as hax
import jax

from levanter_mars.optim.tensor_roles import TensorRole, is_role


#: Axis names of an output vocabulary; an ``Embedding``'s ``Vocab`` axes count too.
VOCAB_AXIS_NAMES = frozenset({"vocab"})


def is_embedding_or_head(roles: Any) -> Callable[[TensorRole], bool]:
    """The LM-head rule, shared by MARS-M (which gives these tensors AdamW) and the role audit.

    An ``Embedding`` table, or a matrix whose rows include a vocabulary: an axis named ``vocab`` or the ``Vocab`` of
    an ``Embedding`` in ``roles`` (an untied LM head). A matrix declared by dimension numbers is neither.
    """
    vocab = set(VOCAB_AXIS_NAMES)
    for role in jax.tree.leaves(roles, is_leaf=is_role):
        if is_role(role) and role.embedding:
            vocab.update(role.rows or ())

    def embedding_or_head(role: TensorRole) -> bool:
        return role.is_matrix and not role.declared and (role.embedding or bool(vocab.intersection(role.rows or ())))

    return embedding_or_head


def non_layer_axes(role: TensorRole, x: Any) -> tuple[str, ...] | int:
    """The axes of ``x`` besides its layer axes: names, or a count for a plain array."""
    if hax.is_named_array(x):
        return tuple(a.name for a in x.axes if a.name not in role.layer_axes)
    return len(x.shape) - len(role.layer_axes)


def undeclared_multi_axis(role: TensorRole, x: Any) -> bool:
    """A tensor no rule made a matrix that has more than one axis besides its layer axes: it would take the 1-D
    branch silently (a conv kernel, or a plain ``[layers, in, out]`` weight without dimension numbers)."""
    extra = non_layer_axes(role, x)
    return not role.is_matrix and not role.by_rule and (len(extra) if isinstance(extra, tuple) else extra) > 1


def undeclared_warning(name: str, role: TensorRole, x: Any) -> str:
    """What the role audit and the optimizers' ``init`` say about a tensor :func:`undeclared_multi_axis` flags."""
    extra = non_layer_axes(role, x)
    extra = extra if isinstance(extra, tuple) else f"{extra} dimensions (shape {tuple(x.shape)})"
    return (
        f"{name}: no rule makes this tensor a matrix, but it has {extra} besides its layer axes {role.layer_axes}; "
        "it takes the 1-D branch (declare a module's matrices with register_tensor_role_rule, a plain array's with "
        "weight_dimension_numbers)"
    )


def role_entries(roles: Any, params: Any) -> list[tuple[str, TensorRole, Any]]:
    """``(path, role, tensor)`` of every tensor of ``params`` that ``roles`` (its roles) has a role for, in order."""
    tensors = {jax.tree_util.keystr(path): x
               for path, x in jax.tree_util.tree_flatten_with_path(params, is_leaf=hax.is_named_array)[0]}
    flat_roles = jax.tree_util.tree_flatten_with_path(roles, is_leaf=is_role)[0]
    return [(name, role, tensors[name]) for name, role in ((jax.tree_util.keystr(p), r) for p, r in flat_roles)
            if is_role(role) and name in tensors]


__all__ = [
    "VOCAB_AXIS_NAMES",
    "is_embedding_or_head",
    "non_layer_axes",
    "role_entries",
    "undeclared_multi_axis",
    "undeclared_warning",
]
