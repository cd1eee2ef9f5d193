"""Named axes decide what MARS treats as a matrix and a layer.

The reference for every check is the plain-array optimizer on the model's "torch view": each layer's Linear weight
as a 2-D (Out, In) matrix, each Embedding as (Vocab, Embed), every other tensor 1-D. A Haliax model with stacked
layers, multi-axis Linears stored both ways round, an Embedding and LayerNorms must follow that reference layer
by layer.
"""

from __future__ import annotations

import math

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter_mars.optim import TensorKind, mars, tensor_roles
from levanter_mars.optim.mars import ADAMW_1D_LABEL, MARS_LABEL, mars_param_labels
from tests.helpers.quadratic import quadratic_step

Layers = hax.Axis("layers", 3)
Embed = hax.Axis("embed", 8)
Heads = hax.Axis("heads", 2)
HeadSize = hax.Axis("head_size", 6)
Mlp = hax.Axis("mlp", 40)
Vocab = hax.Axis("vocab", 20)


class Block(eqx.Module):
    ln: hnn.LayerNorm
    qkv: hnn.Linear  # Embed -> (Heads, HeadSize), stored In-first
    out: hnn.Linear  # (Heads, HeadSize) -> Embed, stored Out-first
    up: hnn.Linear  # Embed -> Mlp: tall (rows 40 > cols 8), so Shampoo's factor is sqrt(5)

    @staticmethod
    def init(*, key):
        k1, k2, k3 = jax.random.split(key, 3)
        return Block(
            ln=hnn.LayerNorm.init(Embed),
            qkv=hnn.Linear.init(In=Embed, Out=(Heads, HeadSize), key=k1, out_first=False),
            out=hnn.Linear.init(In=(Heads, HeadSize), Out=Embed, key=k2, out_first=True),
            up=hnn.Linear.init(In=Embed, Out=Mlp, key=k3, out_first=False),
        )


class Model(eqx.Module):
    embedding: hnn.Embedding
    blocks: hnn.Stacked
    ln_f: hnn.LayerNorm

    @staticmethod
    def init(*, key):
        k1, k2 = jax.random.split(key)
        return Model(
            embedding=hnn.Embedding.init(Vocab, Embed, key=k1),
            blocks=hnn.Stacked.init(Layers, Block)(key=jax.random.split(k2, Layers.size)),
            ln_f=hnn.LayerNorm.init(Embed),
        )


def _matrix(w: hax.NamedArray, rows, cols) -> jnp.ndarray:
    """The torch view: rows = Out axes, cols = In axes, flattened."""
    rows, cols = tuple(rows), tuple(cols)
    w = w.rearrange(rows + cols)
    return w.array.reshape(math.prod(a.size for a in rows), math.prod(a.size for a in cols))


def torch_view(model: Model) -> dict[str, jnp.ndarray]:
    """One plain array per layer per tensor, as the official (PyTorch) code would see the model."""
    flat = {
        "embedding": _matrix(model.embedding.weight, [Vocab], [Embed]),
        "ln_f.weight": model.ln_f.weight.array,
        "ln_f.bias": model.ln_f.bias.array,
    }
    blocks = model.blocks.stacked
    for i in range(Layers.size):
        layer = lambda x: x[Layers, i]  # noqa: E731
        flat[f"{i}.ln.weight"] = layer(blocks.ln.weight).array
        flat[f"{i}.ln.bias"] = layer(blocks.ln.bias).array
        flat[f"{i}.qkv.weight"] = _matrix(layer(blocks.qkv.weight), [Heads, HeadSize], [Embed])
        flat[f"{i}.qkv.bias"] = layer(blocks.qkv.bias).rearrange((Heads, HeadSize)).array.reshape(-1)
        flat[f"{i}.out.weight"] = _matrix(layer(blocks.out.weight), [Embed], [Heads, HeadSize])
        flat[f"{i}.out.bias"] = layer(blocks.out.bias).array
        flat[f"{i}.up.weight"] = _matrix(layer(blocks.up.weight), [Mlp], [Embed])
        flat[f"{i}.up.bias"] = layer(blocks.up.bias).array
    return flat


def random_tree(tree, key, *, layer_scales=(0.02, 0.3, 4.0)):
    """Random values shaped like ``tree``. Layers get very different scales, so that the per-tensor clip of c_t fires
    for some layers and not others: a whole-stack clip would then give different results."""
    leaves, structure = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    out = []
    for leaf, k in zip(leaves, keys):
        noise = jax.random.normal(k, leaf.shape, leaf.dtype)
        out.append(noise)
    new = jax.tree.unflatten(structure, out)
    scales = hax.named(jnp.asarray(layer_scales), Layers)
    stacked = jax.tree.map(lambda x: x * scales, new.blocks.stacked, is_leaf=hax.is_named_array)
    return eqx.tree_at(lambda m: m.blocks.stacked, new, stacked)


def run_both(variant: str, *, exact=False, optimize_1d=False, steps=6, **extra):
    params = eqx.filter(Model.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    kwargs = dict(variant=variant, weight_decay=0.01, exact=exact, optimize_1d=optimize_1d, **extra)
    lr = 3e-3 if variant == "lion" else 2e-2
    return worst_errors_against_plain(mars(lr, **kwargs), mars(lr, **kwargs), params, torch_view, steps)


def worst_errors_against_plain(tx_named, tx_plain, params, view, steps: int) -> dict[str, float]:
    """Trains the named model with ``tx_named`` and its plain ``view`` with ``tx_plain`` on the same seeded
    quadratics; per tensor, the worst error of the named model's view relative to the plain run's largest value."""
    plain = view(params)
    state_named, state_plain = tx_named.init(params), tx_plain.init(plain)
    step_named, step_plain = jax.jit(quadratic_step(tx_named)), jax.jit(quadratic_step(tx_plain))
    worst: dict[str, float] = {}
    for i in range(steps):
        ka, kt = jax.random.split(jax.random.PRNGKey(100 + i))
        a = jax.tree.map(lambda x: jnp.abs(x) + 0.5, random_tree(params, ka, layer_scales=(1.0, 1.0, 1.0)))
        # Targets near the current parameters keep each layer's gradient at its own scale.
        t = jax.tree.map(lambda x, n: x + n, params, random_tree(params, kt))
        params, state_named = step_named(params, state_named, a, t)
        plain, state_plain = step_plain(plain, state_plain, view(a), view(t))
        for name, value in view(params).items():
            reference = np.asarray(plain[name])
            err = float(np.max(np.abs(np.asarray(value) - reference)) / np.max(np.abs(reference)))
            worst[name] = max(worst.get(name, 0.0), err)
    return worst


@pytest.mark.parametrize(
    "variant,exact,optimize_1d,tolerance",
    [
        ("adamw", False, False, 1e-5),
        ("adamw", True, False, 1e-5),
        ("adamw", False, True, 1e-5),
        ("lion", False, False, 1e-5),
        ("shampoo", False, False, 2e-2),
    ],
)
def test_stacked_model_matches_per_layer_reference(variant, exact, optimize_1d, tolerance):
    worst = run_both(variant, exact=exact, optimize_1d=optimize_1d)
    assert max(worst.values()) < tolerance, {k: v for k, v in worst.items() if v >= tolerance}


def test_reference_is_sensitive_to_per_layer_clipping():
    """If the clip were over the whole stack, layer 0 (tiny gradients) would move much less. Check the layers'
    c_t norms straddle 1 so the comparison above exercises the per-layer clip."""
    params = eqx.filter(Model.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    g = random_tree(params, jax.random.PRNGKey(101))
    norms = hax.sqrt(hax.sum(g.blocks.stacked.up.weight**2, axis=(Embed, Mlp))).array
    assert norms.min() < 1.0 < norms.max(), norms


def test_roles_of_the_model():
    params = eqx.filter(Model.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    roles = tensor_roles(params)
    blocks = roles.blocks.stacked
    assert blocks.qkv.weight.kind is TensorKind.MATRIX
    assert blocks.qkv.weight.rows == ("heads", "head_size") and blocks.qkv.weight.cols == ("embed",)
    assert blocks.out.weight.rows == ("embed",) and blocks.out.weight.cols == ("heads", "head_size")
    assert blocks.qkv.weight.layer_axes == ("layers",)
    # [layers, embed] looks 2-D but is a stack of 1-D LayerNorm weights.
    assert blocks.ln.weight.kind is TensorKind.VECTOR and blocks.ln.weight.layer_axes == ("layers",)
    # [layers, heads, head_size] is a stack of biases, not a matrix.
    assert blocks.qkv.bias.kind is TensorKind.VECTOR
    assert roles.embedding.weight.kind is TensorKind.MATRIX and roles.embedding.weight.rows == ("vocab",)
    assert roles.ln_f.weight.kind is TensorKind.VECTOR and roles.ln_f.weight.layer_axes == ()


def test_routing_which_tensors_take_adamw():
    params = eqx.filter(Model.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    labels = mars_param_labels()(params)
    assert labels.embedding.weight == MARS_LABEL
    assert labels.blocks.stacked.up.weight == MARS_LABEL
    assert labels.blocks.stacked.up.bias == ADAMW_1D_LABEL
    assert labels.blocks.stacked.ln.weight == ADAMW_1D_LABEL
    assert labels.ln_f.bias == ADAMW_1D_LABEL
    with_1d = mars_param_labels(optimize_1d=True)(params)
    assert set(jax.tree.leaves(with_1d)) == {MARS_LABEL}


def test_plain_arrays_two_dims_mean_matrix():
    roles = tensor_roles({"w": jnp.zeros((3, 4)), "b": jnp.zeros(4), "k": jnp.zeros((2, 3, 4))})
    assert roles["w"].kind is TensorKind.MATRIX
    assert roles["b"].kind is TensorKind.VECTOR
    assert roles["k"].kind is TensorKind.VECTOR  # as in the reference: only 2-D tensors are matrices


def test_levanter_gpt2_roles():
    """Levanter's GPT-2 stores Linears In-first and stacks its blocks; rows must still be Out."""
    from levanter.models.gpt2 import Gpt2Config

    model = Gpt2Config(seq_len=16, hidden_dim=16, num_layers=2, num_heads=2).build(
        hax.Axis("vocab", 32), key=jax.random.PRNGKey(0)
    )
    roles = tensor_roles(eqx.filter(model, eqx.is_inexact_array))
    attn = roles.transformer.blocks.stacked.attn
    assert attn.c_attn.weight.rows == ("qkv", "heads", "head_size") and attn.c_attn.weight.cols == ("embed",)
    assert attn.c_attn.weight.layer_axes == ("layers",)
    assert roles.transformer.blocks.stacked.ln_1.weight.kind is TensorKind.VECTOR
    assert roles.embeddings.token_embeddings.weight.kind is TensorKind.MATRIX
