"""The role audit: which optimizer branch every parameter takes, counted before anything compiles.

Three branches, decided by :func:`~levanter_mars.optim.tensor_roles.tensor_roles`:

* **MARS matrix**: a ``Linear`` (or ``MoELinear``, per expert) weight other than the LM head;
* **embedding/head**: an ``Embedding`` table, or a matrix whose rows are an embedding's vocabulary (an untied LM
  head). MARS treats these as matrices; MARS-M gives them AdamW, as its official trainer does;
* **AdamW/1-D**: everything else (norms, biases), MARS's 1-D AdamW branch unless ``optimize_1d``.

The table counts tensors, the per-layer (and per-expert) matrices or vectors the update sees, and parameters; the
parameters add up to the model's total. A tensor that no rule makes a matrix but that has more than one axis besides
its layer axes is a warning naming it: it would otherwise take the 1-D branch silently.

``python -m levanter_mars.optim.role_audit --config_path X`` prints the table for a training config without training
(the trainer logs the same table before its first step); ``--verbose`` adds every parameter with its branch, shape,
per-tensor axes and matrix layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any, Sequence

import haliax as hax
import jax

from levanter_mars.optim.dimension_numbers import WeightDimensionNumbers, plain_axis_names, with_dimension_numbers
from levanter_mars.optim.mars_family import update_form
from levanter_mars.optim.role_queries import (
    is_embedding_or_head,
    role_entries,
    undeclared_multi_axis,
    undeclared_warning,
)
from levanter_mars.optim.tensor_roles import TensorRole, tensor_roles

MATRIX, EMBEDDING_OR_HEAD, VECTOR = "MARS matrix", "embedding/head", "AdamW/1-D"
BRANCHES = (MATRIX, EMBEDDING_OR_HEAD, VECTOR)


@dataclasses.dataclass(frozen=True)
class BranchCount:
    branch: str
    update: str
    tensors: int
    per_layer: int
    parameters: int


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One parameter as the optimizer sees it."""

    path: str
    branch: str
    shape: str
    """``name=size`` per axis for a named array (in storage order), the shape for a plain one."""
    per_tensor_axes: tuple[str, ...]
    """The axes each slice of which is its own tensor (layers, experts, batch axes of dimension numbers)."""
    matrix: str
    """``rows x cols`` for a matrix, empty otherwise."""


@dataclasses.dataclass(frozen=True)
class RoleAudit:
    rows: tuple[BranchCount, ...]
    total_parameters: int
    """Counted over the parameter tree's leaves, independently of the branches."""
    warnings: tuple[str, ...]
    branch_of: dict[str, str]
    """``{path: branch}`` for every tensor."""
    entries: tuple[TensorEntry, ...] = ()

    def listing(self) -> str:
        """Every parameter with its branch, shape, per-tensor axes and matrix layout (``--verbose``)."""
        columns = ("parameter", "branch", "shape", "per-tensor axes", "matrix (rows x cols)")
        cells = [columns] + [(e.path, e.branch, e.shape, ", ".join(e.per_tensor_axes) or "-", e.matrix or "-")
                             for e in self.entries]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in cells]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(line.rstrip() for line in lines)

    def table(self) -> str:
        header = f"{'branch':<16} {'update':<22} {'tensors':>8} {'per-layer':>10} {'parameters':>14} {'share':>7}"
        lines = [header, "-" * len(header)]
        for r in self.rows:
            share = r.parameters / self.total_parameters if self.total_parameters else 0.0
            lines.append(
                f"{r.branch:<16} {r.update:<22} {r.tensors:>8} {r.per_layer:>10} {r.parameters:>14,} {share:>7.2%}"
            )
        counted = sum(r.parameters for r in self.rows)
        lines.append(
            f"{'total':<16} {'':<22} {sum(r.tensors for r in self.rows):>8} {sum(r.per_layer for r in self.rows):>10} "
            f"{counted:>14,} {'':>7}  (model: {self.total_parameters:,})"
        )
        return "\n".join(lines)


def branch_updates(optimizer: Any) -> dict[str, str]:
    """What each branch's tensors receive from ``optimizer`` (a Levanter ``OptimizerConfig``, or anything else)."""
    # A config of ours has imported its module; without it, no Levanter needs importing.
    configs = sys.modules.get("levanter_mars.optim.levanter_config")
    if configs is not None and isinstance(optimizer, configs.MarsMConfig):
        efficient = " (efficient)" if optimizer.efficient else ""
        return {MATRIX: f"MARS-M{efficient}", EMBEDDING_OR_HEAD: "AdamW", VECTOR: "AdamW"}
    if configs is not None and isinstance(optimizer, configs.MarsOptimizerConfig):
        exact = " exact" if optimizer.exact else ""
        matrices = f"MARS-{update_form(optimizer.variant, is_matrix=True)}{exact}"
        # With optimize_1d, vectors take MARS, in the form the optimizer gives them (MARS-Shampoo's: MARS-AdamW's).
        vector_form = update_form(optimizer.variant, is_matrix=False)
        vectors = f"MARS-{vector_form}{exact}" if optimizer.optimize_1d else "AdamW (1-D)"
        return {MATRIX: matrices, EMBEDDING_OR_HEAD: matrices, VECTOR: vectors}
    name = type(optimizer).__name__
    return {branch: f"{name} (not MARS)" for branch in BRANCHES}


def _is_parameter(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)


def _size(x: Any) -> int:
    return math.prod(x.array.shape if hax.is_named_array(x) else x.shape)


def _axis_sizes(role: TensorRole, x: Any) -> dict[str, int]:
    """Sizes by the names the role uses (a plain array's undeclared dims beyond its layer axes are left out)."""
    if hax.is_named_array(x):
        return {a.name: a.size for a in x.axes}
    if role.declared:
        return dict(zip(plain_axis_names(len(x.shape)), x.shape))
    return dict(zip(role.layer_axes, x.shape))


def _entry(path: str, branch: str, role: TensorRole, x: Any) -> TensorEntry:
    shape = " ".join(f"{a.name}={a.size}" for a in x.axes) if hax.is_named_array(x) else str(tuple(x.shape))
    matrix = ""
    if role.is_matrix:  # a plain array's default matrix is its last two dims
        rows, cols = (role.rows, role.cols) if role.rows is not None else (("dim -2",), ("dim -1",))
        matrix = f"({', '.join(rows)}) x ({', '.join(cols)})"
    return TensorEntry(path, branch, shape, role.layer_axes, matrix)


def audit_roles(params: Any, optimizer: Any, weight_dimension_numbers: WeightDimensionNumbers = None) -> RoleAudit:
    """The audit of a parameter tree (real arrays or ``jax.eval_shape`` structs) for ``optimizer``, with the
    optimizer's ``weight_dimension_numbers`` if it has any."""
    roles = with_dimension_numbers(tensor_roles(params), params, weight_dimension_numbers)
    embedding_or_head = is_embedding_or_head(roles)
    # Parameters are the floating-point arrays (as Levanter's parameter_count has it), not flags such as dropout's.
    entries = [(name, role, x) for name, role, x in role_entries(roles, params) if _is_parameter(x)]

    counts = {branch: [0, 0, 0] for branch in BRANCHES}
    branch_of, warnings, listed = {}, [], []
    for name, role, x in entries:
        if role.is_matrix:
            branch = EMBEDDING_OR_HEAD if embedding_or_head(role) else MATRIX
        else:
            branch = VECTOR
            if undeclared_multi_axis(role, x):
                warnings.append(undeclared_warning(name, role, x))
        branch_of[name] = branch
        listed.append(_entry(name, branch, role, x))
        per_layer = math.prod(_axis_sizes(role, x)[axis] for axis in role.layer_axes)
        for i, n in enumerate((1, per_layer, _size(x))):
            counts[branch][i] += n

    flat_params = jax.tree_util.tree_flatten_with_path(params, is_leaf=hax.is_named_array)[0]
    total = sum(_size(x) for _, x in flat_params if _is_parameter(x))
    updates = branch_updates(optimizer)
    rows = tuple(BranchCount(b, updates[b], *counts[b]) for b in BRANCHES)
    return RoleAudit(rows, total, tuple(warnings), branch_of, tuple(listed))


def audit_model(model_config: Any, optimizer: Any, vocab_size: int) -> RoleAudit:
    """Audits ``model_config`` built abstractly (``jax.eval_shape``: nothing is allocated or compiled)."""
    Vocab = hax.Axis("vocab", vocab_size)
    model = jax.eval_shape(lambda: model_config.build(Vocab, key=jax.random.PRNGKey(0)))
    return audit_roles(model, optimizer)


def _load_sections(config_path: str) -> dict:
    from draccus.parsers.yaml_loader import SafeLoaderWithInclusion
    import yaml

    with open(config_path) as f:
        return yaml.load(f, SafeLoaderWithInclusion) or {}


def _vocab_size(sections: dict, config_path: str) -> int:
    """The size of the data config's tokenizer, if it is a local directory: the audit never contacts the hub."""
    import os

    tokenizer = (sections.get("data") or {}).get("tokenizer")
    if not tokenizer or not os.path.isdir(os.path.expanduser(tokenizer)):
        raise ValueError(
            f"data.tokenizer {tokenizer!r} is not a local tokenizer directory (a hub name, or the embedded corpus "
            "not built yet): pass --vocab_size"
        )
    from levanter.compat.hf_checkpoints import load_tokenizer

    return len(load_tokenizer(os.path.expanduser(tokenizer)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print which optimizer branch every parameter of a config takes.")
    parser.add_argument("--config_path", required=True)
    parser.add_argument(
        "--vocab_size", type=int, default=None, help="default: the size of data.tokenizer, if a local directory"
    )
    parser.add_argument("--verbose", action="store_true",
                        help="also list every parameter with its branch, shape, per-tensor axes and matrix layout")
    args = parser.parse_args(argv)

    import draccus
    from levanter.models.lm_model import LmConfig
    from levanter.optim import OptimizerConfig

    import levanter_mars.optim.levanter_config  # noqa: F401  (registers the mars-* optimizer types)

    try:
        sections = _load_sections(args.config_path)
        model = draccus.decode(LmConfig, sections.get("model") or {"type": "gpt2"})
        optimizer = draccus.decode(OptimizerConfig, sections.get("optimizer") or {"type": "mars-adamw"})
        vocab_size = args.vocab_size or _vocab_size(sections, args.config_path)
    except (OSError, draccus.utils.DecodingError, ValueError) as e:
        print(f"error: {args.config_path}: {e}", file=sys.stderr)
        return 2
    audit = audit_model(model, optimizer, vocab_size)
    print(f"Tensor roles of {args.config_path} (model.type={type(model).__name__}, vocab {vocab_size}):")
    print(audit.table())
    if args.verbose:
        print()
        print(audit.listing())
    for warning in audit.warnings:
        print(f"warning: {warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
