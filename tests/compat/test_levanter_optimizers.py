"""Defect 8 of the pinned Levanter's optimizers, which ``levanter_mars.compat.levanter_optimizers`` works around."""

import jax.numpy as jnp
import pytest


def test_defect_8_levanter_mars_calls_removed_jax_tree_map():
    from levanter.optim.mars import scale_by_mars

    tx = scale_by_mars(max_grad_norm=1.0)
    params = {"w": jnp.ones((2, 2))}
    with pytest.raises(AttributeError, match="tree_map"):
        tx.update(params, tx.init(params), params)
