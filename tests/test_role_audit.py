"""What the role audit (``levanter_mars.optim.role_audit``) says each branch's tensors receive, held to what the
optimizer does with them."""

import jax
import numpy as np
import pytest

from levanter_mars.optim import scale_by_mars
from levanter_mars.optim.levanter_config import MarsAdamWConfig, MarsLionConfig, MarsShampooConfig
from levanter_mars.optim.role_audit import EMBEDDING_OR_HEAD, MATRIX, VECTOR, branch_updates


def test_mars_shampoo_with_optimize_1d_labels_its_vectors_mars_adamw():
    assert branch_updates(MarsShampooConfig(optimize_1d=True)) == {
        MATRIX: "MARS-shampoo", EMBEDDING_OR_HEAD: "MARS-shampoo", VECTOR: "MARS-adamw"}
    assert branch_updates(MarsShampooConfig(optimize_1d=True, exact=True))[VECTOR] == "MARS-adamw exact"
    assert branch_updates(MarsShampooConfig())[VECTOR] == "AdamW (1-D)"
    assert branch_updates(MarsLionConfig(optimize_1d=True))[VECTOR] == "MARS-lion"


def _directions(variant, params, steps=3):
    tx = scale_by_mars(variant, optimize_1d=True)
    state, out = tx.init(params), []
    for step in range(steps):
        grads = jax.tree.map(lambda p: jax.random.normal(jax.random.PRNGKey(step), p.shape), params)
        updates, state = tx.update(grads, state, params)
        out.append(updates)
    return out


@pytest.mark.parametrize("config", [MarsAdamWConfig, MarsLionConfig, MarsShampooConfig])
def test_with_optimize_1d_a_vector_moves_as_the_labelled_variant_moves_a_matrix(config):
    """``MARS-X`` on the vectors' row means: a vector takes the step MARS-X gives a matrix of the same entries (a
    1 x n matrix, for the elementwise forms the same step; MARS-Shampoo would orthogonalize it instead)."""
    labelled = branch_updates(config(optimize_1d=True))[VECTOR].removeprefix("MARS-")
    vector = jax.random.normal(jax.random.PRNGKey(7), (12,))
    as_vector = _directions(config.variant, {"b": vector})
    as_matrix = _directions(labelled, {"b": vector.reshape(1, 12)})
    for step, (ours, theirs) in enumerate(zip(as_vector, as_matrix)):
        np.testing.assert_allclose(ours["b"], theirs["b"].reshape(12), rtol=1e-6, atol=1e-7, err_msg=f"step {step}")
