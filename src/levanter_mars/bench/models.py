"""GPT-2 parameter trees and a train-step loss for the speed benchmarks, built from the repository's configs.

Levanter is imported for its GPT-2 model only. When ``import levanter`` fails (its package ``__init__`` imports every
subsystem: Ray, TensorStore, lm-eval, ...; a GPU image may lack one), the model modules are imported without it
(defects 24 and 25 in ``levanter_mars.compat``). The loss is written here, not taken from Levanter: the
pinned Levanter's loss passes a float ``where=`` mask that jax >= 0.8 rejects (defect 7 in
``levanter_mars.compat``), and the benchmarks must also run on newer jax.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import yaml

from levanter_mars.compat import newer_jax

REPO = Path(__file__).resolve().parents[3]
CONFIG_DIR = REPO / "config"


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A GPT-2 of the repository: its config file, vocabulary and the batch the step benchmark feeds it; ``overrides``
    are ``(field, value)`` pairs that replace the config's model fields."""

    name: str
    config_file: str
    vocab_size: int
    batch_size: int
    overrides: tuple[tuple[str, Any], ...] = ()


PYDOCS_VOCAB = 4096  # levanter_mars.training.data.pydocs_corpus.VOCAB_SIZE (not imported: it pulls in the tokenizer stack)
GPT2_VOCAB = 50257
SIZES = {
    size.name: size
    for size in (
        ModelSize("nano", "gpt2_nano_mars.yaml", PYDOCS_VOCAB, 16),
        ModelSize("bench", "bench_convergence.yaml", PYDOCS_VOCAB, 16),
        ModelSize("small", "gpt2_small_mars.yaml", GPT2_VOCAB, 8),
        ModelSize("medium", "gpt2_medium_mars.yaml", GPT2_VOCAB, 4),
        # GPT-2 small's widths and vocabulary with 2 layers and biases: its update compiles for a TPU in seconds,
        # not minutes (tests/test_tpu_update_goals.py).
        ModelSize("small-reduced", "gpt2_small_mars.yaml", GPT2_VOCAB, 8, (("num_layers", 2), ("use_bias", True))),
    )
}


def select(names: str, known: dict[str, Any], flag: str) -> list[Any]:
    """``known``'s entries by comma-separated name; unknown names raise ``SystemExit`` naming ``flag`` and listing
    the known ones."""
    wanted = names.split(",")
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"{flag}: unknown {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


def select_sizes(names: str) -> list[ModelSize]:
    return select(names, SIZES, "--sizes")


def _yaml_loader() -> type:
    class Loader(yaml.SafeLoader):
        pass

    # The recipe configs ``!include`` their data section, which the model does not need.
    Loader.add_constructor("!include", lambda loader, node: None)
    return Loader


def gpt2_config(size: ModelSize) -> Any:
    """Levanter's ``Gpt2Config`` with the ``model:`` section of ``config/<size.config_file>``."""
    newer_jax.levanter_importable()
    from levanter.models.gpt2 import Gpt2Config

    model = yaml.load((CONFIG_DIR / size.config_file).read_text(), Loader=_yaml_loader())["model"]
    fields = {k: v for k, v in model.items() if k != "type"}
    return Gpt2Config(**{**fields, **dict(size.overrides)})


def gpt2_initializer(size: ModelSize) -> tuple[Callable[[jax.Array], Any], Any]:
    """``(init, config)``: ``init(key)`` builds Levanter's ``Gpt2LMHeadModel`` of ``size`` (layers stacked); run it
    under ``jax.jit`` for values or ``jax.eval_shape`` for shapes only."""
    newer_jax.levanter_importable()
    import haliax as hax
    from levanter.models.gpt2 import Gpt2LMHeadModel

    config = gpt2_config(size)
    vocab = hax.Axis("vocab", size.vocab_size)
    return (lambda key: Gpt2LMHeadModel.init(vocab, config, key=key)), config


def init_gpt2(size: ModelSize, *, seed: int = 0) -> tuple[Any, Any]:
    """``(model, config)``: the model of :func:`gpt2_initializer`, initialized on the default device."""
    init, config = gpt2_initializer(size)
    return jax.jit(init)(jax.random.PRNGKey(seed)), config


def trainable(model: Any) -> Any:
    return eqx.filter(model, eqx.is_inexact_array)


def parameter_count(tree: Any) -> int:
    """Floating-point entries of ``tree``, arrays or shapes alike (``jax.ShapeDtypeStruct``)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree)
               if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact))


def buffer_bytes(tree: Any) -> int:
    """Bytes of the tree's per-parameter buffers; scalars (step counts, injected hyperparameters) are left out."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if getattr(x, "ndim", 0) > 0)


def like_gradients(params: Any, *, seed: int = 1, scale: float = 1e-3) -> Any:
    """A gradient-shaped tree of small random values (update costs do not depend on the values)."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [scale * jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, noisy)


def token_batch(config: Any, vocab_size: int, batch_size: int, *, seed: int = 2) -> Any:
    """``[batch, position]`` random token ids (the step benchmark reuses one batch)."""
    import haliax as hax

    batch = hax.Axis("batch", batch_size)
    ids = jax.random.randint(jax.random.PRNGKey(seed), (batch_size, config.Pos.size), 0, vocab_size, jnp.int32)
    return hax.named(ids, (batch, config.Pos))


def _cast_floating(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)


def next_token_loss(model: Any, tokens: Any, *, compute_dtype: Any = jnp.float32) -> jax.Array:
    """Mean next-token cross-entropy of a causal LM, masking the last position (a boolean mask, jax >= 0.8 safe).

    ``compute_dtype`` is the mixed-precision compute dtype (Levanter's ``mp: p=f32,c=...``): the parameters are cast
    to it for the forward pass; the loss itself is computed in float32.
    """
    from levanter.layers.attention import AttentionMask

    batch, pos = tokens.axes
    logits = _cast_floating(model, compute_dtype)(tokens, attn_mask=AttentionMask.causal(), key=None)
    logits = logits.rearrange((batch, pos, model.Vocab)).array.astype(jnp.float32)
    ids = tokens.array
    targets = jnp.roll(ids, -1, axis=1)
    predicted = jnp.arange(pos.size) < pos.size - 1
    log_partition = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = jnp.where(predicted[None, :], log_partition - target_logits, 0.0)
    return jnp.sum(nll) / (batch.size * (pos.size - 1))
