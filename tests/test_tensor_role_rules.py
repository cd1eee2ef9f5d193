"""Role rules a user extends: the most specific class's rule wins; experts fused into one ``Linear`` are matrices per
expert; one LM-head rule for MARS-M and the role audit.

The references are plain arrays the plain-array rule (and the official code) treats as matrices: each head's or
expert's ``[out, in]`` slice as a tensor of its own.
"""

from __future__ import annotations

import dataclasses
import importlib

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter_mars.optim import TensorKind, TensorRole, mars, mars_m_roles, register_tensor_role_rule, tensor_roles
from levanter_mars.optim.role_audit import EMBEDDING_OR_HEAD, MATRIX, audit_roles
from levanter_mars.optim.tensor_roles import is_role, register_expert_axis_name

# The module, not the function ``levanter_mars.optim.tensor_roles`` that the package exports under its name.
tensor_roles_module = importlib.import_module("levanter_mars.optim.tensor_roles")

Embed, Heads, HeadSize = hax.Axis("embed", 6), hax.Axis("heads", 3), hax.Axis("head_size", 4)
Experts, Mlp, Vocab = hax.Axis("experts", 3), hax.Axis("mlp", 5), hax.Axis("vocab", 7)


class PerHeadLinear(hnn.Linear):
    """An attention projection whose heads the user wants orthogonalized one by one."""


def _per_head_rule(linear: PerHeadLinear, layer_axes: tuple[str, ...]) -> PerHeadLinear:
    weight = TensorRole(TensorKind.MATRIX, layer_axes + ("heads",), rows=("head_size",), cols=("embed",))
    return dataclasses.replace(linear, weight=weight, bias=TensorRole(TensorKind.VECTOR, layer_axes))


def _as(cls, linear: hnn.Linear):
    return cls(linear.weight, linear.bias, linear.In, linear.Out, dot_general=linear.dot_general)


@pytest.fixture
def own_registries(monkeypatch):
    """Rules and expert axis names registered by a test are gone after it."""
    monkeypatch.setattr(tensor_roles_module, "_MODULE_RULES", dict(tensor_roles_module._MODULE_RULES))
    monkeypatch.setattr(tensor_roles_module, "_EXPERT_AXIS_NAMES", set(tensor_roles_module._EXPERT_AXIS_NAMES))


def _linear(In, Out, key=0):
    return hnn.Linear.init(In=In, Out=Out, key=jax.random.PRNGKey(key))


def _train(tx, params, view=lambda tree: tree, scales=None, steps=4):
    """Trains ``view(params)`` with ``tx`` on per-entry quadratics drawn for ``params`` (then viewed), whose targets
    sit ``scales`` (a tree like ``params``; default 1) random units away from the start."""
    start = params
    trained, state = view(params), tx.init(view(params))

    @jax.jit
    def step(trained, state, a, t):
        def loss(p):
            return sum(jnp.sum(0.5 * aa * (x - tt) ** 2)
                       for x, aa, tt in zip(jax.tree.leaves(p), jax.tree.leaves(a), jax.tree.leaves(t)))

        updates, state = tx.update(jax.grad(loss)(trained), state, trained)
        return optax.apply_updates(trained, updates), state

    for i in range(steps):
        leaves, structure = jax.tree.flatten(start, is_leaf=hax.is_named_array)
        keys = jax.random.split(jax.random.PRNGKey(100 + i), 2 * len(leaves))
        a = [hax.named(jnp.abs(jax.random.normal(k, x.array.shape)) + 0.5, x.axes) for k, x in zip(keys, leaves)]
        t = [x + hax.named(jax.random.normal(k, x.array.shape), x.axes) for k, x in zip(keys[len(leaves):], leaves)]
        a, t = jax.tree.unflatten(structure, a), jax.tree.unflatten(structure, t)
        if scales is not None:
            t = jax.tree.map(lambda tt, x, s: x + (tt - x) * s, t, start, scales)
        trained, state = step(trained, state, view(a), view(t))
    return trained


def test_a_rule_for_a_subclass_of_linear_wins_over_linears(own_registries):
    plain = _linear(Embed, (Heads, HeadSize))
    per_head = _as(PerHeadLinear, plain)
    assert tensor_roles(per_head).weight.rows == ("heads", "head_size")  # inherited from Linear until registered
    register_tensor_role_rule(PerHeadLinear, _per_head_rule)
    roles = tensor_roles({"per_head": per_head, "plain": plain})
    assert roles["per_head"].weight.layer_axes == ("heads",) and roles["per_head"].weight.rows == ("head_size",)
    assert roles["plain"].weight.layer_axes == () and roles["plain"].weight.rows == ("heads", "head_size")


def test_the_subclass_rule_is_what_the_optimizer_uses(own_registries):
    """MARS-Shampoo on the per-head Linear equals MARS-Shampoo on each head's [head_size, embed] slice."""
    register_tensor_role_rule(PerHeadLinear, _per_head_rule)
    model = _as(PerHeadLinear, _linear(Embed, (Heads, HeadSize)))
    params = eqx.filter(model, eqx.is_inexact_array)
    tx = mars(2e-2, variant="shampoo")

    def heads(m):
        weight = m.weight.rearrange((Heads, HeadSize, Embed)).array
        return {f"head{h}": weight[h] for h in range(Heads.size)}

    reference, start = _train(tx, params, heads), heads(params)
    ours = heads(_train(tx, params))
    whole = heads(_train(tx, eqx.filter(_linear(Embed, (Heads, HeadSize)), eqx.is_inexact_array)))
    assert _worst(ours, reference, start) < 1e-2
    assert _worst(whole, reference, start) > 0.1  # guard: the heads as one matrix


def test_the_most_specific_class_wins_whatever_the_registration_order(own_registries):
    register_tensor_role_rule(PerHeadLinear, _per_head_rule)

    def everything_a_vector(linear, layer_axes):
        vector = TensorRole(TensorKind.VECTOR, layer_axes)
        return dataclasses.replace(linear, weight=vector, bias=vector)

    register_tensor_role_rule(hnn.Linear, everything_a_vector)  # replaces the built-in rule, registered later
    plain = _linear(Embed, (Heads, HeadSize))
    assert not tensor_roles(plain).weight.is_matrix
    assert tensor_roles(_as(PerHeadLinear, plain)).weight.layer_axes == ("heads",)


def test_experts_fused_into_one_linear_are_matrices_per_expert():
    up, down, router = _linear(Embed, (Experts, Mlp)), _linear((Experts, Mlp), Embed, 1), _linear(Embed, Experts, 2)
    roles = tensor_roles({"up": up, "down": down, "router": router})
    assert roles["up"].weight == TensorRole(TensorKind.MATRIX, ("experts",), rows=("mlp",), cols=("embed",))
    assert roles["up"].bias.layer_axes == ("experts",)
    assert roles["down"].weight == TensorRole(TensorKind.MATRIX, ("experts",), rows=("embed",), cols=("mlp",))
    # A router's Out is nothing but the experts: one matrix, as HF Mixtral's gate.
    assert roles["router"].weight == TensorRole(TensorKind.MATRIX, (), rows=("experts",), cols=("embed",))


def _fused_against_separate(up):
    """Worst error of MARS-AdamW on a fused experts Linear against each expert's [mlp, embed] matrix, relative to
    the reference's displacement; the experts' targets sit at very different distances, so that the clip of c_t
    fires for some experts only."""
    params = eqx.filter(up, eqx.is_inexact_array)
    weight_scales = jnp.broadcast_to(jnp.array([0.01, 0.3, 5.0])[:, None, None], (Experts.size, Mlp.size, Embed.size))
    scales = dataclasses.replace(params, weight=hax.named(weight_scales, (Experts, Mlp, Embed)),
                                 bias=hax.ones((Experts, Mlp)))
    tx = mars(2e-2, weight_decay=0.01)

    def experts(m):
        weight = m.weight.rearrange((Experts, Mlp, Embed)).array
        bias = m.bias.rearrange((Experts, Mlp)).array
        return {**{f"w{e}": weight[e] for e in range(Experts.size)}, **{f"b{e}": bias[e] for e in range(Experts.size)}}

    ours = experts(_train(tx, params, scales=scales))
    return _worst(ours, _train(tx, params, experts, scales=scales), experts(params))


def _worst(ours, reference, start):
    """The worst difference, relative to each tensor's largest displacement in the reference."""
    return max(float(np.max(np.abs(ours[n] - reference[n])) / np.max(np.abs(reference[n] - start[n])))
               for n in reference)


def test_fused_experts_train_as_separate_experts(own_registries, monkeypatch):
    up = _linear(Embed, (Experts, Mlp))
    assert _fused_against_separate(up) < 2e-5
    monkeypatch.setattr(tensor_roles_module, "_EXPERT_AXIS_NAMES", set())  # guard: one (experts x mlp) x embed matrix
    assert _fused_against_separate(up) > 1e-2


def test_an_experts_axis_the_user_names(own_registries):
    Moe = hax.Axis("moe", 2)
    linear = _linear(Embed, (Moe, Mlp))
    assert tensor_roles(linear).weight.layer_axes == ()
    register_expert_axis_name("moe")
    assert tensor_roles(linear).weight.layer_axes == ("moe",)


class HeadOnly(eqx.Module):
    """No Embedding: an untied LM head is recognizable only by its vocabulary axis."""

    proj: hnn.Linear
    lm_head: hnn.Linear


@pytest.mark.parametrize("vocab_axis", ["vocab", "tokens"])
def test_the_audit_and_mars_m_share_one_lm_head_rule(vocab_axis):
    V = hax.Axis(vocab_axis, 7)
    parts = {"proj": _linear(Embed, Mlp), "lm_head": _linear(Mlp, V, 1)}
    if vocab_axis == "vocab":
        model = HeadOnly(**parts)
    else:  # the vocabulary axis has another name: the Embedding's tells
        model = {**parts, "wte": hnn.Embedding.init(V, Mlp, key=jax.random.PRNGKey(3))}
    params = eqx.filter(model, eqx.is_inexact_array)
    audit = audit_roles(params, None)
    heads = {p for p, b in audit.branch_of.items() if b == EMBEDDING_OR_HEAD}
    assert any("lm_head" in p for p in heads), audit.branch_of
    matrices = {jax.tree_util.keystr(p) for p, r in jax.tree_util.tree_flatten_with_path(
        mars_m_roles(params), is_leaf=is_role)[0] if is_role(r) and r.is_matrix}
    assert {p for p, b in audit.branch_of.items() if b == MATRIX} == matrices and any("proj" in p for p in matrices)
