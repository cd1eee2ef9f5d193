"""MARS-M on a Haliax model with stacked layers, an Embedding and an untied head follows the official routing.

The reference is MARS-M on the model's "torch view" (tests/test_mars_named_axes.py) with roles given *by name*, as the
official trainer assigns them: each layer's Linear weights are matrices, the embedding, the LM head and every 1-D
tensor take AdamW. The named-axis optimizer must pick the same roles by itself and match layer by layer.
"""

from __future__ import annotations

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import pytest

from levanter_mars.optim import mars_m, mars_m_roles
from tests.test_mars_named_axes import Block, Embed, Layers, Vocab, _matrix, torch_view, worst_errors_against_plain


class ModelWithHead(eqx.Module):
    embedding: hnn.Embedding
    blocks: hnn.Stacked
    ln_f: hnn.LayerNorm
    head: hnn.Linear  # untied: Embed -> Vocab

    @staticmethod
    def init(*, key):
        k1, k2, k3 = jax.random.split(key, 3)
        return ModelWithHead(
            embedding=hnn.Embedding.init(Vocab, Embed, key=k1),
            blocks=hnn.Stacked.init(Layers, Block)(key=jax.random.split(k2, Layers.size)),
            ln_f=hnn.LayerNorm.init(Embed),
            head=hnn.Linear.init(In=Embed, Out=Vocab, key=k3, use_bias=False),
        )


def head_torch_view(model: ModelWithHead) -> dict:
    return torch_view(model) | {"head": _matrix(model.head.weight, [Vocab], [Embed])}


def official_matrix_mask(flat: dict) -> dict:
    """The official trainer's routing by name: per-layer Linear weights are matrices; embeddings and the head are not."""
    return {name: name.split(".", 1)[-1] in ("qkv.weight", "out.weight", "up.weight") for name in flat}


def _params():
    return eqx.filter(ModelWithHead.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)


def test_default_roles_follow_the_official_routing():
    roles = mars_m_roles(_params())
    stacked = roles.blocks.stacked
    assert stacked.qkv.weight.is_matrix and stacked.out.weight.is_matrix and stacked.up.weight.is_matrix
    assert not roles.embedding.weight.is_matrix
    assert not roles.head.weight.is_matrix  # Out is the vocabulary
    assert not stacked.ln.weight.is_matrix and not stacked.qkv.bias.is_matrix


def test_levanter_gpt2_embeddings_take_adamw():
    from levanter.models.gpt2 import Gpt2Config

    model = Gpt2Config(seq_len=16, hidden_dim=16, num_layers=2, num_heads=2).build(
        hax.Axis("vocab", 32), key=jax.random.PRNGKey(0)
    )
    roles = mars_m_roles(eqx.filter(model, eqx.is_inexact_array))
    assert not roles.embeddings.token_embeddings.weight.is_matrix
    assert not roles.embeddings.position_embeddings.weight.is_matrix
    assert roles.transformer.blocks.stacked.attn.c_attn.weight.is_matrix
    assert roles.transformer.blocks.stacked.mlp.c_proj.weight.is_matrix


def test_matrix_mask_overrides():
    params = _params()
    roles = mars_m_roles(params, lambda p: jax.tree.map(lambda _: False, p))
    assert not any(r.is_matrix for r in jax.tree.leaves(roles, is_leaf=lambda x: hasattr(x, "is_matrix")))
    prefix = eqx.tree_at(lambda m: m.head, jax.tree.map(lambda _: False, params), True)
    assert mars_m_roles(params, prefix).head.weight.is_matrix


@pytest.mark.slow  # compiles Newton-Schulz for every matrix shape, twice
@pytest.mark.parametrize("mode", [dict(), dict(exact=True), dict(efficient=True)])
def test_stacked_model_matches_per_layer_reference(mode):
    params = _params()
    plain = head_torch_view(params)
    tx_named = mars_m(2e-2, weight_decay=0.01, **mode)
    tx_plain = mars_m(2e-2, weight_decay=0.01, matrix_mask=official_matrix_mask(plain), **mode)

    worst = worst_errors_against_plain(tx_named, tx_plain, params, head_torch_view, steps=5)
    # Matrices go through bf16 Newton-Schulz in a different memory layout; everything else is float32 AdamW.
    matrices = {k: v for k, v in worst.items() if official_matrix_mask(worst)[k]}
    others = {k: v for k, v in worst.items() if k not in matrices}
    assert max(matrices.values()) < 2e-2, matrices
    assert max(others.values()) < 1e-5, others
