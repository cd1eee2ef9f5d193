"""What MARS treats as a matrix, a 1-D tensor and a layer, decided by named axes.

The official MARS code routes a tensor by ``len(grad.shape) == 2``. That rule is wrong for Haliax models:
scanned layers (``haliax.nn.Stacked``) add a leading layer axis, so a LayerNorm weight ``[layers, embed]`` looks
2-D and an attention weight ``[layers, embed, qkv, heads, head_size]`` looks 5-D. Here the *module* and its
*named axes* decide instead:

* ``haliax.nn.Linear.weight`` is one matrix of (all ``Out`` axes) x (all ``In`` axes), whatever order it is stored
  in; rows are ``Out``, as in ``torch.nn.Linear``.
* ``haliax.nn.MoELinear.weight`` (Mixtral's experts, ``[layers, experts, out, in]``) is one ``Out`` x ``In`` matrix
  *per expert*: the ``Experts`` axis is a per-tensor axis like the layer axis, since HF Mixtral keeps one
  ``nn.Linear`` per expert and the official code routes each as a 2-D matrix. Its bias is a per-expert vector.
* ``haliax.nn.Embedding.weight`` is a ``Vocab`` x ``Embed`` matrix.
* Every other named array (LayerNorm weights and biases, Linear biases, ...) is a vector: it takes the
  separate AdamW branch unless ``optimize_1d``.
* The ``Block`` axis of every enclosing ``haliax.nn.Stacked`` (and an ``MoELinear``'s ``Experts``) is a *layer axis*: per-tensor quantities (the clip
  norm, Newton-Schulz, the Shampoo factor) are computed per layer, so a stacked model is optimized exactly as if
  each layer were its own tensor.
* A ``haliax.nn.Linear`` whose ``Out`` or ``In`` holds an experts axis (:func:`register_expert_axis_name`; default
  ``experts``), experts fused into one Linear, is a matrix *per expert*, like an ``MoELinear``; a router, whose ``Out``
  is nothing but the experts axis, stays one matrix.
* Plain (unnamed) arrays follow the reference: two dimensions mean a matrix of (rows = dim 0, cols = dim 1). Any
  other layout is declared with optax-style dimension numbers (:mod:`levanter_mars.optim.dimension_numbers`).

Other modules declare their matrices with :func:`register_tensor_role_rule`; the rule of the most specific class
wins (a rule for a subclass of ``hnn.Linear`` overrides ``Linear``'s, and a rule registered for a built-in class
replaces the built-in). What MARS-M and the role audit ask of the roles (the one LM-head rule, the tensors that would
take the 1-D branch silently) is in :mod:`levanter_mars.optim.role_queries`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Sequence

import haliax as hax
import haliax.nn as hnn
import jax
from haliax.jax_utils import is_jax_array_like
from haliax.nn.normalization import LayerNormBase


class TensorKind(enum.Enum):
    MATRIX = "matrix"
    VECTOR = "vector"


@dataclasses.dataclass(frozen=True)
class TensorRole:
    """How MARS sees one parameter tensor. A static (non-array) pytree leaf.

    Attributes:
        kind: matrix or vector.
        layer_axes: names of the ``Stacked`` layer axes around this tensor; everything per-tensor is per layer.
        rows, cols: for named matrices, the axis names that form the rows (``Out``) and the columns (``In``).
            ``None`` for plain arrays, whose rows and columns are dims 0 and 1 (after the layer dims).
        embedding: an ``Embedding`` table (a matrix to MARS; MARS-M gives embeddings to AdamW).
        by_rule: a registered rule (or dimension numbers) decided the role; False for the generic fallback (any
            other named array, and plain arrays), which is warned about when such a vector has more than one
            non-layer axis (:func:`undeclared_multi_axis`).
        declared: the user's dimension numbers decided the role: a matrix of their rows and columns, which no
            LM-head rule moves to AdamW. Plain arrays so declared are named ``dim0``, ``dim1``, ... by position.
    """

    kind: TensorKind
    layer_axes: tuple[str, ...] = ()
    rows: tuple[str, ...] | None = None
    cols: tuple[str, ...] | None = None
    embedding: bool = False
    by_rule: bool = True
    declared: bool = False

    @property
    def is_matrix(self) -> bool:
        return self.kind is TensorKind.MATRIX


def _axis_names(axes: Any) -> tuple[str, ...]:
    return tuple(hax.axis_name(ax) for ax in hax.axis_spec_to_tuple(axes))


RoleRule = Callable[[Any, tuple[str, ...]], Any]
_MODULE_RULES: dict[type, RoleRule] = {}


#: Axis names that hold a model's experts (see :func:`register_expert_axis_name`).
_EXPERT_AXIS_NAMES = {"experts"}


def register_tensor_role_rule(module_type: type, rule: RoleRule) -> None:
    """Teach :func:`tensor_roles` which fields of ``module_type`` are matrices.

    ``rule(module, layer_axes)`` must return the module with each array field replaced by a :class:`TensorRole`
    (fields that are ``None`` or masked stay as they are). A module takes the rule of the most specific class in its
    method resolution order that has one: subclasses inherit their parent's rule until they register their own, and
    registering for a class that already has a rule (a built-in one included) replaces it.
    """
    _MODULE_RULES[module_type] = rule


def register_expert_axis_name(name: str) -> None:
    """Declare ``name`` an experts axis: a ``Linear`` whose ``Out`` or ``In`` holds it is a matrix per expert."""
    _EXPERT_AXIS_NAMES.add(name)


def _replace_if_array(module: Any, **roles: TensorRole) -> Any:
    present = {name: role for name, role in roles.items() if hax.is_named_array(getattr(module, name))}
    return dataclasses.replace(module, **present)


def _linear_rule(linear: hnn.Linear, layer_axes: tuple[str, ...]) -> hnn.Linear:
    rows, cols = _axis_names(linear.Out), _axis_names(linear.In)
    experts = tuple(name for name in rows + cols if name in _EXPERT_AXIS_NAMES)
    per_expert_rows = tuple(name for name in rows if name not in experts)
    per_expert_cols = tuple(name for name in cols if name not in experts)
    if experts and per_expert_rows and per_expert_cols:  # experts fused into one Linear; not a router (Out = experts)
        layer_axes, rows, cols = layer_axes + experts, per_expert_rows, per_expert_cols
    weight = TensorRole(TensorKind.MATRIX, layer_axes, rows=rows, cols=cols)
    return _replace_if_array(linear, weight=weight, bias=TensorRole(TensorKind.VECTOR, layer_axes))


def _embedding_rule(embedding: hnn.Embedding, layer_axes: tuple[str, ...]) -> hnn.Embedding:
    weight = TensorRole(
        TensorKind.MATRIX,
        layer_axes,
        rows=_axis_names(embedding.Vocab),
        cols=_axis_names(embedding.Embed),
        embedding=True,
    )
    return _replace_if_array(embedding, weight=weight)


def _moe_linear_rule(linear: hnn.MoELinear, layer_axes: tuple[str, ...]) -> hnn.MoELinear:
    per_expert = layer_axes + _axis_names(linear.Experts)
    weight = TensorRole(TensorKind.MATRIX, per_expert, rows=_axis_names(linear.Out), cols=_axis_names(linear.In))
    return _replace_if_array(linear, weight=weight, bias=TensorRole(TensorKind.VECTOR, per_expert))


def _norm_rule(norm: LayerNormBase, layer_axes: tuple[str, ...]) -> LayerNormBase:
    # A norm's scale and bias are vectors whatever their axes (OLMo 2's q_norm is [kv_head, q_heads_per_group,
    # head_size]; HF stores it 1-D).
    vector = TensorRole(TensorKind.VECTOR, layer_axes)
    return _replace_if_array(norm, weight=vector, bias=vector)


register_tensor_role_rule(hnn.Linear, _linear_rule)
register_tensor_role_rule(hnn.MoELinear, _moe_linear_rule)
register_tensor_role_rule(hnn.Embedding, _embedding_rule)
register_tensor_role_rule(LayerNormBase, _norm_rule)


def _rule_for(node: Any) -> RoleRule | None:
    for module_type in type(node).__mro__:
        if module_type in _MODULE_RULES:
            return _MODULE_RULES[module_type]
    return None


def tensor_roles(tree: Any, layer_axes: Sequence[str] = ()) -> Any:
    """Returns ``tree`` with every array leaf replaced by its :class:`TensorRole`.

    ``None`` and ``optax.MaskedNode`` stay where they are, so the result is a tree prefix of ``tree`` (and of
    any optimizer state built leaf-for-leaf from it).
    """
    layer_axes = tuple(layer_axes)

    def is_leaf(x: Any) -> bool:
        return isinstance(x, hnn.Stacked) or _rule_for(x) is not None or hax.is_named_array(x)

    def visit(node: Any) -> Any:
        if isinstance(node, hnn.Stacked):
            return dataclasses.replace(node, stacked=tensor_roles(node.stacked, layer_axes + (node.Block.name,)))
        rule = _rule_for(node)
        if rule is not None:
            claimed = rule(node, layer_axes)
            # Fields the rule does not claim (a subclass's extra parameters, say) are classified generically.
            return jax.tree.map(visit, claimed, is_leaf=lambda x: x is not claimed and is_leaf(x))
        if hax.is_named_array(node):
            return TensorRole(TensorKind.VECTOR, layer_axes, by_rule=False)
        if is_jax_array_like(node):
            per_layer_ndim = len(node.shape) - len(layer_axes)
            kind = TensorKind.MATRIX if per_layer_ndim == 2 else TensorKind.VECTOR
            return TensorRole(kind, layer_axes, by_rule=False)
        return node

    return jax.tree.map(visit, tree, is_leaf=is_leaf)


def is_role(x: Any) -> bool:
    return isinstance(x, TensorRole)


def map_roles(fn: Callable[..., Any], roles: Any, *trees: Any) -> Any:
    """``jax.tree.map`` over a roles tree, handing ``fn(role, *subtrees)`` the matching subtree of each tree."""
    return jax.tree.map(fn, roles, *trees, is_leaf=is_role)


def per_layer(fn: Callable[..., Any], role: TensorRole) -> Callable[..., Any]:
    """Vectorizes a function written for one tensor over the role's layer axes (Haliax's named vmap).

    Plain arrays are mapped over their leading dims, which is where a ``Stacked`` module keeps its layers.
    """
    if not role.layer_axes:
        return fn
    return hax.vmap(fn, role.layer_axes)


def restore_axis_order(out: Any, like: Any) -> Any:
    """``hax.vmap`` returns mapped axes first; put a result back in the layout of the tensor it replaces."""
    if hax.is_named_array(out) and hax.is_named_array(like) and out.axes != like.axes:
        return out.rearrange(like.axes)
    return out


def describe_roles(tree: Any) -> dict[str, TensorRole]:
    """A flat ``{path: role}`` view, for logging which tensors take which branch."""
    roles = tensor_roles(tree)
    flat, _ = jax.tree_util.tree_flatten_with_path(roles, is_leaf=is_role)
    return {jax.tree_util.keystr(path): role for path, role in flat if is_role(role)}


__all__ = [
    "TensorKind",
    "TensorRole",
    "describe_roles",
    "is_role",
    "map_roles",
    "per_layer",
    "register_expert_axis_name",
    "register_tensor_role_rule",
    "restore_axis_order",
    "tensor_roles",
]
