"""optax-style dimension numbers: which axes of a weight are the rows and the columns of its matrices, for any model.

A Flax ``nn.scan`` or an Equinox model stacked with ``filter_vmap`` holds a weight as a plain ``[layers, in, out]``
array, which the plain-array rule ("two dimensions are a matrix") would send to the 1-D branch. optax's Muon describes
such weights with ``optax.contrib.MuonDimensionNumbers(reduction_axis, output_axis)``. ``weight_dimension_numbers`` of
:func:`~levanter_mars.optim.mars`, :func:`~levanter_mars.optim.mars_m` and their ``scale_by_*`` takes the same objects
(:class:`MuonDimensionNumbers` here is optax's, or ours where the installed optax has none; any object with
``reduction_axis`` and ``output_axis`` does), as a tree like the parameters, a prefix of it, or a callable of the
parameters returning either:

* the matrix of a weight has the **output axes as rows and the reduction axes as columns**: the reference's
  ``[out, in]`` for a 2-D tensor, so that the Shampoo factor ``sqrt(max(1, rows/cols))`` is the reference's;
* **every other axis is per-tensor**, like a Haliax layer axis: the clip of :math:`c_t`, Newton-Schulz and the
  Shampoo factor are per slice, exactly as if each slice were its own ``[out, in]`` tensor;
* ``None`` sends a plain array to the AdamW branch (as optax's Muon does); a named (Haliax) array given ``None``
  keeps the role its module's rule gives it, and one given dimension numbers takes them instead;
* axes are positions (negative ones count from the end) for any array, or axis names for a named array.

Without dimension numbers, a plain array with 3 or more dimensions besides its layer axes is reported by the role
audit and warned about when an optimizer is initialized (:func:`warn_undeclared`).
"""

from __future__ import annotations

import numbers
import operator
import warnings
from typing import Any, NamedTuple, Sequence

import equinox as eqx
import haliax as hax
import jax
import numpy as np

from levanter_mars.optim.role_queries import role_entries, undeclared_multi_axis, undeclared_warning
from levanter_mars.optim.tensor_roles import TensorKind, TensorRole, map_roles


class _DimensionNumbers(NamedTuple):
    """``optax.contrib.MuonDimensionNumbers``' fields: the axes a matrix-vector product reduces over (columns) and
    the axes it outputs (rows); every other axis is a batch (per-tensor) axis."""

    reduction_axis: Sequence[int | str] | int | str = 0
    output_axis: Sequence[int | str] | int | str = 1


try:  # optax's own where the installed optax has it, so that one object serves Muon and MARS
    from optax.contrib import MuonDimensionNumbers
except ImportError:  # pragma: no cover - an optax without Muon's dimension numbers
    MuonDimensionNumbers = _DimensionNumbers

WeightDimensionNumbers = Any
"""A tree (or prefix tree) of dimension numbers and ``None``, or a callable of the parameters returning one."""


def is_dimension_numbers(x: Any) -> bool:
    return hasattr(x, "reduction_axis") and hasattr(x, "output_axis")


def plain_axis_names(ndim: int) -> tuple[str, ...]:
    """The names a plain array's axes take once dimension numbers declare it: ``dim0``, ``dim1``, ... by position."""
    return tuple(f"dim{i}" for i in range(ndim))


def named_like_role(x: Any, role: TensorRole) -> Any:
    """A plain array whose role dimension numbers declared, as the named array the role reads (axes by position)."""
    if role.declared and not hax.is_named_array(x):
        return hax.named(x, plain_axis_names(x.ndim))
    return x


def _axis_specs(spec: Any, where: str, field: str) -> tuple[int | str, ...]:
    """One field's axes, each a name or a Python int. Any integer counts (``numpy.int64`` from an array's shape
    arithmetic, say); a bool, an int to Python, is refused: ``True`` is a mistake, not axis 1."""
    several = isinstance(spec, Sequence) and not isinstance(spec, str)
    specs = tuple(spec) if several or (isinstance(spec, np.ndarray) and spec.ndim) else (spec,)
    for axis in specs:
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (str, numbers.Integral)):
            raise TypeError(f"weight_dimension_numbers at {where}: {field} {axis!r} is neither an axis position (an "
                            "integer) nor an axis name (a string)")
    return tuple(axis if isinstance(axis, str) else operator.index(axis) for axis in specs)


def _resolve_axes(spec: Any, names: tuple[str, ...], named: bool, where: str, field: str) -> tuple[str, ...]:
    specs = _axis_specs(spec, where, field)
    if not specs:
        raise ValueError(f"weight_dimension_numbers at {where}: {field} is empty")
    out = []
    for axis in specs:
        if isinstance(axis, str):
            if not named or axis not in names:
                raise ValueError(f"weight_dimension_numbers at {where}: {field} {axis!r} is not an axis of "
                                 f"{'the named array, whose axes are ' + str(names) if named else 'a plain array'}")
            out.append(axis)
        elif -len(names) <= axis < len(names):
            out.append(names[axis % len(names)])
        else:
            raise ValueError(f"weight_dimension_numbers at {where}: {field} {axis} is out of range for "
                             f"{len(names)} axes")
    return tuple(out)


def _declared_role(numbers: Any, role: TensorRole, x: Any, where: str) -> TensorRole:
    named = hax.is_named_array(x)
    if numbers is None:
        if named:
            return role
        return TensorRole(TensorKind.VECTOR, role.layer_axes, by_rule=True)
    names = tuple(a.name for a in x.axes) if named else plain_axis_names(len(x.shape))
    rows = _resolve_axes(numbers.output_axis, names, named, where, "output_axis")
    cols = _resolve_axes(numbers.reduction_axis, names, named, where, "reduction_axis")
    if set(rows) & set(cols) or len(set(rows)) < len(rows) or len(set(cols)) < len(cols):
        raise ValueError(f"weight_dimension_numbers at {where}: output axes {rows} and reduction axes {cols} must be "
                         "distinct")
    layer_axes = tuple(name for name in names if name not in rows + cols)
    return TensorRole(TensorKind.MATRIX, layer_axes, rows=rows, cols=cols, embedding=role.embedding, declared=True)


def tree_of(spec: Any, params: Any) -> Any:
    """An optax-style "tree or callable of the parameters" argument, as a tree. A tree shaped like an Equinox model
    is a module, which is callable too: modules are trees."""
    return spec(params) if callable(spec) and not isinstance(spec, eqx.Module) else spec


def with_dimension_numbers(roles: Any, params: Any, weight_dimension_numbers: WeightDimensionNumbers) -> Any:
    """``roles`` (of ``params``) with the roles ``weight_dimension_numbers`` declares; unchanged for ``None``."""
    if weight_dimension_numbers is None:
        return roles
    numbers = tree_of(weight_dimension_numbers, params)

    def is_leaf(x: Any) -> bool:  # a Haliax model's tree, mapped with jax.tree.map, holds NamedArrays of numbers
        return x is None or is_dimension_numbers(x) or hax.is_named_array(x)

    def declare(path: Any, leaf: Any, roles_subtree: Any, params_subtree: Any) -> Any:
        leaf = leaf.array if hax.is_named_array(leaf) else leaf
        where = jax.tree_util.keystr(path) or "the root"
        return map_roles(lambda role, x: _declared_role(leaf, role, x, where), roles_subtree, params_subtree)

    return jax.tree_util.tree_map_with_path(declare, numbers, roles, params, is_leaf=is_leaf)


def warn_undeclared(roles: Any, params: Any) -> None:
    """One warning, at an optimizer's ``init``, naming every tensor that would take the 1-D branch silently."""
    messages = [undeclared_warning(path, role, x) for path, role, x in role_entries(roles, params)
                if undeclared_multi_axis(role, x)]
    if messages:
        warnings.warn("MARS: " + "; ".join(messages), UserWarning, stacklevel=3)


__all__ = [
    "MuonDimensionNumbers",
    "WeightDimensionNumbers",
    "is_dimension_numbers",
    "named_like_role",
    "plain_axis_names",
    "tree_of",
    "warn_undeclared",
    "with_dimension_numbers",
]
