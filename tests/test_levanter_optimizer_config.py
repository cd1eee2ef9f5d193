"""MARS in Levanter's optimizer registry: YAML/CLI parsing, schedules, logging, weight-decay routing."""

import textwrap
from dataclasses import dataclass, field

import draccus
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.models.gpt2 import Gpt2Config
from levanter.optim import OptimizerConfig

from levanter_mars.optim.levanter_config import (
    MARS_OPTIMIZER_TYPES,
    MarsAdamWConfig,
    MarsLionConfig,
    MarsShampooConfig,
)


@dataclass
class _Wrapper:
    optimizer: OptimizerConfig = field(default_factory=MarsAdamWConfig)


def _parse(yaml_text: str, args=(), tmp_path=None):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    return draccus.parse(_Wrapper, config_path=str(path), args=list(args))


def test_types_are_registered_without_touching_upstream_mars():
    from levanter.optim import mars as upstream_mars

    registry = OptimizerConfig.get_known_choices()
    assert registry["mars"] is upstream_mars.MarsConfig
    for name, cls in MARS_OPTIMIZER_TYPES.items():
        assert registry[name] is cls


@pytest.mark.parametrize("type_name,cls", sorted(MARS_OPTIMIZER_TYPES.items()))
def test_yaml_and_cli_overrides(tmp_path, type_name, cls):
    cfg = _parse(
        f"""
        optimizer:
          type: {type_name}
          learning_rate: 3e-3
          learning_rate_1d: 1e-3
          exact: true
        """,
        args=["--optimizer.gamma", "0.05"],
        tmp_path=tmp_path,
    )
    assert isinstance(cfg.optimizer, cls)
    assert cfg.optimizer.learning_rate == pytest.approx(3e-3)
    assert cfg.optimizer.learning_rate_1d == pytest.approx(1e-3)
    assert cfg.optimizer.exact is True
    assert cfg.optimizer.gamma == pytest.approx(0.05)


@pytest.mark.parametrize("via", ["yaml", "cli"])
def test_amsgrad_from_yaml_and_cli_adds_its_buffer(tmp_path, via):
    yaml_text = "optimizer:\n  type: mars-adamw\n" + ("  amsgrad: true\n" if via == "yaml" else "")
    cfg = _parse(yaml_text, args=["--optimizer.amsgrad", "true"] if via == "cli" else [], tmp_path=tmp_path)
    assert cfg.optimizer.amsgrad is True and MarsAdamWConfig().amsgrad is False
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    (on,) = [s for s in jax.tree.leaves(cfg.optimizer.build(10).init(params), is_leaf=lambda x: hasattr(x, "nu_max"))
             if hasattr(s, "nu_max")]
    assert {k: v.shape for k, v in on.nu_max.items()} == {"w": (4, 3), "b": (3,)}


def test_misspelled_field_is_rejected(tmp_path):
    with pytest.raises(draccus.utils.DecodingError, match="gama"):
        _parse("optimizer:\n  type: mars-adamw\n  gama: 0.1\n", tmp_path=tmp_path)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beta1=1.0), "optimizer.beta1"),
        (dict(beta2=1.5), "optimizer.beta2"),
        (dict(beta1_1d=-0.5), "optimizer.beta1_1d"),
        (dict(gamma=2.0), "optimizer.gamma"),
        (dict(learning_rate=-1.0), "optimizer.learning_rate"),
        (dict(learning_rate_1d=-1.0), "optimizer.learning_rate_1d"),
        (dict(weight_decay_1d=-1.0), "optimizer.weight_decay_1d"),
        (dict(mu_dtype="fp8"), "optimizer.mu_dtype"),
        (dict(max_grad_norm=-1.0), "optimizer.max_grad_norm"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MarsAdamWConfig(**kwargs)


def test_cli_bad_value_keeps_the_field_name(tmp_path):
    with pytest.raises(Exception) as info:
        _parse("optimizer:\n  type: mars-lion\n", args=["--optimizer.beta2", "1.2"], tmp_path=tmp_path)
    chain = [info.value, info.value.__cause__, info.value.__context__]
    assert any("optimizer.beta2" in str(e) for e in chain if e is not None)


def _gpt2_params():
    model = Gpt2Config(seq_len=16, hidden_dim=16, num_layers=2, num_heads=2).build(
        hax.Axis("vocab", 32), key=jax.random.PRNGKey(0)
    )
    return eqx.filter(model, eqx.is_inexact_array)


@pytest.mark.slow  # compiles the update on GPT-2
def test_both_learning_rates_follow_levanter_schedules_and_are_logged():
    cfg = MarsAdamWConfig(learning_rate=4e-3, warmup=10, min_lr_ratio=0.1, lr_schedule="cosine")
    tx = cfg.build(100)
    params = _gpt2_params()
    state = tx.init(params)
    assert set(state.hyperparams) >= {"learning_rate", "learning_rate_1d", "gamma"}
    lr, lr_1d = cfg.lr_scheduler(100), cfg.lr_scheduler(100, override_lr=2e-3)
    for step in (0, 5, 10, 50, 99):
        assert float(lr_1d(step)) == pytest.approx(float(lr(step)) / 2, rel=1e-6)
    update = jax.jit(tx.update)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(5):
        _, state = update(zeros, state, params)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(float(lr(4)), rel=1e-6)
    assert float(state.hyperparams["learning_rate_1d"]) == pytest.approx(float(lr(4)) / 2, rel=1e-6)


@pytest.mark.slow  # builds and updates a GPT-2
def test_weight_decay_routing_matches_reference():
    """With zero gradients the update is pure decay: Linear weights decay with weight_decay at lr, embeddings not
    at all, and every 1-D tensor with weight_decay_1d at lr_1d."""
    lr, lr_1d, wd, wd_1d = 1e-2, 3e-3, 0.05, 0.2
    cfg = MarsAdamWConfig(
        learning_rate=lr, learning_rate_1d=lr_1d, weight_decay=wd, weight_decay_1d=wd_1d, warmup=0,
        lr_schedule="constant",
    )
    params = _gpt2_params()
    tx = cfg.build(10)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)

    def check(update, param, expected_rate):
        np.testing.assert_allclose(update.array, -expected_rate * param.array, rtol=1e-5, atol=1e-9)

    blocks, p_blocks = updates.transformer.blocks.stacked, params.transformer.blocks.stacked
    check(blocks.attn.c_attn.weight, p_blocks.attn.c_attn.weight, lr * wd)
    check(blocks.mlp.c_proj.weight, p_blocks.mlp.c_proj.weight, lr * wd)
    check(updates.embeddings.token_embeddings.weight, params.embeddings.token_embeddings.weight, 0.0)
    check(updates.embeddings.position_embeddings.weight, params.embeddings.position_embeddings.weight, 0.0)
    check(blocks.ln_1.weight, p_blocks.ln_1.weight, lr_1d * wd_1d)
    check(blocks.attn.c_attn.bias, p_blocks.attn.c_attn.bias, lr_1d * wd_1d)
    check(updates.transformer.ln_f.weight, params.transformer.ln_f.weight, lr_1d * wd_1d)


@pytest.mark.slow  # compiles the exact objective for each variant (~20 s together)
@pytest.mark.parametrize("cls", [MarsAdamWConfig, MarsLionConfig, MarsShampooConfig])
def test_exact_config_uses_the_objective(cls):
    params = _gpt2_params()
    tx = cls(exact=True, warmup=0).build(10)
    state = tx.init(params)
    calls = []

    def obj_fn(p):
        calls.append(1)
        return sum(jnp.sum(x.array**2) for x in jax.tree.leaves(p, is_leaf=hax.is_named_array))

    grads = jax.tree.map(jnp.ones_like, params)
    tx.update(grads, state, params, obj_fn=obj_fn, loss=1.0)  # Levanter also passes loss=: it must be ignored
    assert calls
    with pytest.raises(ValueError, match="obj_fn"):
        tx.update(grads, state, params)
