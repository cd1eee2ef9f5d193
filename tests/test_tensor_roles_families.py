"""Tensor roles of every Levanter LM family, held to the official routing on a torch view of the same weights.

The torch view is what Levanter's own HF export writes (``to_torch_compatible_state_dict``): one tensor per layer, and
per expert for Mixtral, named and shaped as in the HF model. The official MARS code routes a tensor by
``ndim == 2``: a 2-D weight is a matrix, everything else 1-D. Each of our matrices, layer by layer (and expert by
expert), must be that 2-D tensor: the same entries in the same rows and columns, up to the order of rows and of
columns and a transpose (GPT-2's HF ``Conv1D`` stores ``In x Out``), none of which changes a norm or an
orthogonalization.
"""

from __future__ import annotations

import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from haliax.state_dict import to_torch_compatible_state_dict
from levanter.utils.jax_utils import parameter_count

from levanter_mars.optim import describe_roles, mars_m_roles, tensor_roles
from levanter_mars.optim.levanter_config import MarsAdamWConfig, MarsMConfig
from levanter_mars.optim.role_audit import EMBEDDING_OR_HEAD, MATRIX, VECTOR, audit_model, audit_roles
from levanter_mars.optim.tensor_roles import is_role
from tests.helpers.families import MORE_TINY_MODELS, TINY_MODELS, model_config

ALL_FAMILIES = {**TINY_MODELS, **MORE_TINY_MODELS}
VOCAB = 64


def _build(name):
    config = model_config(ALL_FAMILIES[name])
    return config, config.build(hax.Axis("vocab", VOCAB), key=jax.random.PRNGKey(0))


def _numbered(model):
    """The model with every entry a distinct number, so a torch-view tensor tells where each entry came from."""
    leaves, treedef = jax.tree.flatten(model, is_leaf=hax.is_named_array)
    offset, out = 0, []
    for leaf in leaves:
        if hax.is_named_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            size = leaf.array.size
            values = jnp.arange(offset, offset + size, dtype=jnp.float32).reshape(leaf.array.shape)
            out.append(hax.named(values, leaf.axes))
            offset += size
        else:
            out.append(leaf)
    assert offset < 2**24  # exact in float32
    return jax.tree.unflatten(treedef, out)


def _our_tensors(model):
    """``{first entry: (path, role, plain matrix or vector)}`` per layer/expert slice: our view, re-derived here
    from the role's axis names (rows = role.rows flattened, cols = role.cols flattened)."""
    roles = describe_roles(model)
    arrays = {
        jax.tree_util.keystr(p): x
        for p, x in jax.tree_util.tree_flatten_with_path(model, is_leaf=hax.is_named_array)[0]
        if hax.is_named_array(x)
    }
    out = {}
    for path, role in roles.items():
        x = arrays[path]
        layer_sizes = [x.axis_size(a) for a in role.layer_axes]
        for index in np.ndindex(*layer_sizes):
            piece = x[dict(zip(role.layer_axes, index))] if role.layer_axes else x
            if role.is_matrix:
                piece = piece.rearrange(role.rows + role.cols).array
                rows = math.prod(piece.shape[: len(role.rows)])
                value = np.asarray(piece).reshape(rows, -1)
            else:
                value = np.asarray(piece.array).reshape(-1)
            out[float(value.min())] = (f"{path}{list(index) if index else ''}", role, value)
    return out


def _same_matrix_up_to_permutations(a: np.ndarray, b: np.ndarray) -> bool:
    def lines(m):
        return {frozenset(r.tolist()) for r in m}, {frozenset(c.tolist()) for c in m.T}

    return lines(a) in (lines(b), lines(b.T))


@pytest.mark.parametrize("family", sorted(ALL_FAMILIES))
def test_roles_match_the_official_routing_on_the_torch_view(family):
    _, model = _build(family)
    model = _numbered(model)
    ours = _our_tensors(model)
    torch_view = {k: np.asarray(v) for k, v in to_torch_compatible_state_dict(model).items()}
    matched = set()
    for name, weight in torch_view.items():
        key = float(weight.min())
        assert key in ours, f"{family}: {name} {weight.shape} is not one of our per-layer tensors"
        path, role, value = ours[key]
        matched.add(key)
        if weight.ndim == 2:  # the official code's matrix
            assert role.is_matrix, f"{family}: {name} is a matrix to the official code; ours {path} is {role}"
            assert _same_matrix_up_to_permutations(value, weight), (family, name, path, value.shape, weight.shape)
        else:
            assert weight.ndim == 1 and not role.is_matrix, (family, name, weight.shape, path, role)
            assert sorted(value.tolist()) == sorted(weight.reshape(-1).tolist()), (family, name, path)
    assert matched == set(ours), f"{family}: tensors the torch view lacks: {[ours[k][0] for k in set(ours) - matched]}"


def test_mixtral_experts_are_per_expert_matrices_and_the_router_a_matrix():
    config, model = _build("mixtral")
    roles = tensor_roles(model).transformer.layers.stacked.block_sparse_moe
    for w in ("w1", "w2", "w3"):
        role = getattr(roles.experts, w).weight
        assert role.is_matrix and role.layer_axes == ("layers", "experts"), role
    assert roles.experts.w2.weight.rows == ("embed",) and roles.experts.w2.weight.cols == ("mlp",)
    assert roles.gate.weight.is_matrix and roles.gate.weight.rows == ("experts",)
    # MARS-M orthogonalizes each expert (its default matrices include them) but not the embedding or the head.
    m_roles = mars_m_roles(model)
    assert m_roles.transformer.layers.stacked.block_sparse_moe.experts.w1.weight.is_matrix
    assert not m_roles.embeddings.token_embeddings.weight.is_matrix and not m_roles.lm_head.weight.is_matrix


def test_grouped_query_heads_are_one_matrix_per_layer_in_torch_row_order():
    _, model = _build("llama")
    q = tensor_roles(model).transformer.layers.stacked.self_attn.q_proj.weight
    assert q.rows == ("kv_head", "q_heads_per_group", "head_size") and q.cols == ("embed",)
    # HF's q_proj rows are head-major with head h = kv_head * group + g: the flattening order above.
    numbered = _numbered(model)
    ours = numbered.transformer.layers.stacked.self_attn.q_proj.weight["layer", 0]
    ours = np.asarray(ours.rearrange(q.rows + q.cols).array).reshape(32, 32)
    torch_q = np.asarray(to_torch_compatible_state_dict(numbered)["model.layers.0.self_attn.q_proj.weight"])
    assert {frozenset(r.tolist()) for r in ours} == {frozenset(r.tolist()) for r in torch_q}


@pytest.mark.parametrize("family", sorted(ALL_FAMILIES))
@pytest.mark.parametrize("optimizer", [MarsAdamWConfig(), MarsMConfig()], ids=["mars-adamw", "mars-m"])
def test_role_audit_accounts_for_every_parameter(family, optimizer):
    config, model = _build(family)
    audit = audit_model(config, optimizer, VOCAB)
    assert audit.total_parameters == parameter_count(model)
    assert sum(r.parameters for r in audit.rows) == parameter_count(model)
    assert sum(r.tensors for r in audit.rows) == len(jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
    assert audit.warnings == ()
    # The audit's MARS matrices are exactly what MARS-M orthogonalizes by default.
    m_roles = {jax.tree_util.keystr(p): r for p, r in jax.tree_util.tree_flatten_with_path(
        mars_m_roles(eqx.filter(model, eqx.is_inexact_array)), is_leaf=is_role)[0] if is_role(r)}
    assert {p for p, b in audit.branch_of.items() if b == MATRIX} == {p for p, r in m_roles.items() if r.is_matrix}
    heads = [p for p, b in audit.branch_of.items() if b == EMBEDDING_OR_HEAD]
    tied = getattr(config, "tie_word_embeddings", family.startswith("gemma") or family == "gpt2")
    assert any("lm_head" in p for p in heads) is (not tied), heads
    assert "Embedding" not in "".join(p for p, b in audit.branch_of.items() if b == VECTOR)


def test_audit_table_for_mixtral_counts_experts_as_matrices():
    config, _ = _build("mixtral")
    audit = audit_model(config, MarsMConfig(), VOCAB)
    rows = {r.branch: r for r in audit.rows}
    # 2 layers: q, k, v, o and the router (5 x 2), and 3 expert weights x 4 experts (24).
    assert rows[MATRIX].per_layer == 10 + 24
    expert_params = 2 * 4 * 3 * 32 * 32
    attention = 32 * 32 + 16 * 32 + 16 * 32 + 32 * 32  # q, k, v (2 kv heads x 8), o
    assert rows[MATRIX].parameters == 2 * (attention + 4 * 32) + expert_params
    assert rows[MATRIX].update == "MARS-M" and rows[EMBEDDING_OR_HEAD].update == "AdamW"
    table = audit.table()
    assert "MARS matrix" in table and f"{audit.total_parameters:,}" in table


def test_a_multi_axis_tensor_no_rule_claims_is_a_warning_naming_it():
    class Odd(eqx.Module):
        kernel: hax.NamedArray  # [layers-free] conv-like (a, b, c): no rule, more than one axis
        scale: hax.NamedArray

    odd = Odd(kernel=hax.ones((hax.Axis("a", 2), hax.Axis("b", 3), hax.Axis("c", 4))), scale=hax.ones(hax.Axis("d", 5)))
    audit = audit_roles(odd, MarsAdamWConfig())
    assert len(audit.warnings) == 1 and ".kernel" in audit.warnings[0] and "('a', 'b', 'c')" in audit.warnings[0]
    assert audit.branch_of[".kernel"] == VECTOR and sum(r.parameters for r in audit.rows) == 29
