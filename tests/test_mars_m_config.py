"""MARS-M in Levanter's optimizer registry (``type: mars-m``): every field from YAML and the CLI, errors naming the
field, the official decay of every tensor, and the loss hook in exact mode."""

import dataclasses
import textwrap

import draccus
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.optim import OptimizerConfig

from levanter_mars.optim.levanter_config import MarsMConfig
from tests.test_levanter_optimizer_config import _gpt2_params, _Wrapper

# A value different from the default for every field MARS-M adds to Levanter's OptimizerConfig.
NON_DEFAULTS = {
    "learning_rate": 3e-3,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "gamma": 0.05,
    "beta1_adamw": 0.8,
    "beta2_adamw": 0.99,
    "epsilon": 1e-6,
    "ns_steps": 6,
    "exact": False,  # True is checked alone: exact and efficient exclude each other
    "efficient": True,
    "max_grad_norm": 0.5,
    "mu_dtype": "bfloat16",
    "prev_dtype": "float16",
}


def _parse(yaml_text: str, args, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    return draccus.parse(_Wrapper, config_path=str(path), args=list(args))


def test_registered():
    assert OptimizerConfig.get_known_choices()["mars-m"] is MarsMConfig


def test_every_field_is_covered_here():
    inherited = {f.name for f in dataclasses.fields(OptimizerConfig)} - {"learning_rate", "weight_decay"}
    assert {f.name for f in dataclasses.fields(MarsMConfig)} - inherited == set(NON_DEFAULTS)


@pytest.mark.parametrize("via", ["yaml", "cli"])
def test_every_field_from_yaml_and_cli(tmp_path, via):
    def text(value):
        return str(value).lower() if isinstance(value, bool) else str(value)

    if via == "yaml":
        body = "".join(f"  {k}: {text(v)}\n" for k, v in NON_DEFAULTS.items())
        cfg = _parse(f"optimizer:\n  type: mars-m\n{body}", [], tmp_path)
    else:
        args = [a for k, v in NON_DEFAULTS.items() for a in (f"--optimizer.{k}", text(v))]
        cfg = _parse("optimizer:\n  type: mars-m\n", args, tmp_path)
    assert isinstance(cfg.optimizer, MarsMConfig)
    for name, value in NON_DEFAULTS.items():
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert getattr(cfg.optimizer, name) == expected, name
    exact = _parse("optimizer:\n  type: mars-m\n", ["--optimizer.exact", "true"], tmp_path).optimizer
    assert exact.exact is True and exact.efficient is False


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beta1=1.0), "optimizer.beta1"),
        (dict(beta1_adamw=-0.1), "optimizer.beta1_adamw"),
        (dict(beta2_adamw=1.0), "optimizer.beta2_adamw"),
        (dict(gamma=1.5), "optimizer.gamma"),
        (dict(epsilon=-1.0), "optimizer.epsilon"),
        (dict(learning_rate=-1.0), "optimizer.learning_rate"),
        (dict(weight_decay=float("inf")), "optimizer.weight_decay"),
        (dict(ns_steps=0), "optimizer.ns_steps"),
        (dict(max_grad_norm=0.0), "optimizer.max_grad_norm"),
        (dict(mu_dtype="fp8"), "optimizer.mu_dtype"),
        (dict(prev_dtype="int8"), "optimizer.prev_dtype"),
        (dict(min_lr_ratio=2.0), "optimizer.min_lr_ratio"),
        (dict(exact=True, efficient=True), "optimizer.efficient"),
        (dict(efficient=True, beta1=0.0), "optimizer.beta1"),
        (dict(weight_decay_modules=["attn"]), "optimizer.weight_decay_modules"),
        (dict(default_weight_decay_mask=False), "optimizer.default_weight_decay_mask"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MarsMConfig(**kwargs)


def test_cli_bad_value_keeps_the_field_name(tmp_path):
    with pytest.raises(Exception) as info:
        _parse("optimizer:\n  type: mars-m\n  exact: true\n", ["--optimizer.efficient", "true"], tmp_path)
    chain = [info.value, info.value.__cause__, info.value.__context__]
    assert any("optimizer.efficient" in str(e) for e in chain if e is not None)


def test_every_tensor_decays_at_the_one_learning_rate():
    """With zero gradients the update is pure decay, x * lr * wd, for matrices, embeddings and 1-D tensors alike (the
    official trainer decays every tensor)."""
    lr, wd = 1e-2, 0.05
    params = _gpt2_params()
    tx = MarsMConfig(learning_rate=lr, weight_decay=wd, warmup=0, lr_schedule="constant").build(10)
    updates, state = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    assert set(state.hyperparams) >= {"learning_rate", "gamma"}
    for update, param in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
        np.testing.assert_allclose(update, -lr * wd * param, rtol=1e-5, atol=1e-9)


def test_exact_config_uses_the_objective():
    params = _gpt2_params()
    tx = MarsMConfig(exact=True, warmup=0).build(10)
    calls = []

    def obj_fn(p):
        calls.append(1)
        return sum(jnp.sum(x.array**2) for x in jax.tree.leaves(p, is_leaf=hax.is_named_array))

    grads = jax.tree.map(jnp.ones_like, params)
    tx.update(grads, tx.init(params), params, obj_fn=obj_fn, loss=1.0)
    assert calls
