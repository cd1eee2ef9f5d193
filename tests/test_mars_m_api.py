"""The public optax API of levanter_mars.optim.mars_m: errors and the state each mode keeps."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

from levanter_mars.optim import ScaleByMarsState, mars_m
from tests.test_mars_api import _mars_state, _nbytes
from tests.test_mars_m_named_axes import ModelWithHead


def _params():
    return eqx.filter(ModelWithHead.init(key=jax.random.PRNGKey(0)), eqx.is_inexact_array)


def _sizes(params):
    """(all parameters, parameters of the Linear weights inside the blocks): counted by hand, not by our roles."""
    stacked = params.blocks.stacked
    matrices = sum(w.size for w in (stacked.qkv.weight, stacked.out.weight, stacked.up.weight))
    return sum(x.size for x in jax.tree.leaves(params)), matrices


def test_state_bytes_of_each_mode():
    """efficient keeps Muon's state (a momentum for every tensor, AdamW's second moment for the rest); approx adds the
    previous gradient of the matrices; exact the previous parameters of everything."""
    params = _params()
    total, matrices = _sizes(params)
    muon = 4 * total + 4 * (total - matrices)
    state_bytes = {
        mode: _nbytes(_mars_state(mars_m(1e-3, **kwargs).init(params)))
        for mode, kwargs in {"approx": {}, "exact": {"exact": True}, "efficient": {"efficient": True}}.items()
    }
    assert state_bytes["efficient"] - 4 == muon  # 4: the int32 step count
    assert state_bytes["approx"] - 4 == muon + 4 * matrices
    assert state_bytes["exact"] - 4 == muon + 4 * total


def test_efficient_and_exact_exclude_each_other():
    with pytest.raises(ValueError, match="efficient"):
        mars_m(1e-3, exact=True, efficient=True)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(b1=1.0), "b1"),
        (dict(b1_adamw=-0.1), "b1_adamw"),
        (dict(b2_adamw=1.0), "b2_adamw"),
        (dict(gamma=1.5), "gamma"),
        (dict(eps=-1.0), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(ns_steps=0), "ns_steps"),
        (dict(ns_steps=2.5), "ns_steps"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(efficient=True, b1=0.0), "b1"),
    ],
)
def test_bad_hyperparameters_name_the_argument(kwargs, field):
    with pytest.raises(ValueError, match=field):
        mars_m(1e-3, **kwargs)


def test_exact_without_obj_fn_raises_clear_error():
    params = _params()
    tx = mars_m(1e-3, exact=True)
    with pytest.raises(ValueError, match="obj_fn"):
        tx.update(params, tx.init(params), params)


def test_gamma_schedule_and_mu_dtype():
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    tx = mars_m(optax.constant_schedule(1e-2), gamma=optax.linear_schedule(0.0, 0.1, 10), mu_dtype=jnp.bfloat16)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), state, params)
    inner = _mars_state(state)
    assert isinstance(inner, ScaleByMarsState) and inner.mu["w"].dtype == jnp.bfloat16
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))
