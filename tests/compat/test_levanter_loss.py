"""Defect 7 of the pinned Levanter's loss, which ``levanter_mars.compat.levanter_loss`` works around."""

import inspect
import warnings

import haliax as hax
import jax
import jax.numpy as jnp
import pytest


def _next_token_loss_inputs():
    Batch, Pos, Embed, Vocab = hax.Axis("b", 2), hax.Axis("position", 6), hax.Axis("embed", 4), hax.Axis("vocab", 7)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    embeddings = hax.random.normal(k1, (Batch, Pos, Embed))
    lm_head = hax.random.normal(k2, (Embed, Vocab))
    ids = hax.named(jax.random.randint(k3, (2, 6), 0, 7), (Batch, Pos))
    float_mask = hax.named(jnp.array([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 1]], dtype=jnp.float32), (Batch, Pos))
    return (Pos, Embed, Vocab, embeddings, lm_head, ids), float_mask


def _plain_next_token_loss(embeddings, lm_head, ids, mask) -> float:
    """Mean cross-entropy of the next token over the masked positions but the last, in plain jnp."""
    logits = embeddings.array @ lm_head.array
    targets = jnp.roll(ids.array, -1, axis=1)
    token_loss = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
    keep = (mask.array != 0).at[:, -1].set(False)
    return float(jnp.sum(jnp.where(keep, token_loss, 0.0)) / jnp.sum(keep))


def test_defect_7_levanter_loss_passes_a_float_where_mask_and_the_workaround_casts_it(monkeypatch):
    from levanter.models import loss as levanter_loss

    from levanter_mars.compat import levanter_loss as loss_fix

    upstream = {name: inspect.unwrap(getattr(levanter_loss, name)) for name in loss_fix.MASKED_LOSSES}
    for name, function in upstream.items():  # however an earlier test left the module
        monkeypatch.setattr(levanter_loss, name, function)
    args, float_mask = _next_token_loss_inputs()

    def loss_and_messages():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = levanter_loss.maybe_fused_next_token_loss(*args, loss_mask=float_mask, reduction=hax.mean)
            except (TypeError, ValueError) as error:  # jax >= 0.8
                return None, [str(error)]
        return float(value.array), [str(w.message) for w in caught]

    _, upstream_messages = loss_and_messages()  # jax 0.7: a deprecation warning; jax >= 0.8: an error
    assert any("where must be None or a boolean array" in m for m in upstream_messages), upstream_messages
    loss_fix.boolean_loss_masks()
    loss_fix.boolean_loss_masks()  # idempotent: wraps once
    assert all(getattr(levanter_loss, name).__wrapped__ is function for name, function in upstream.items())
    value, messages = loss_and_messages()
    assert not any("where must be None" in m for m in messages), messages
    assert value == pytest.approx(_plain_next_token_loss(*args[3:], float_mask), rel=1e-5)
