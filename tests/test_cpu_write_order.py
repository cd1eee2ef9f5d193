"""The order of the update's writes on XLA:CPU (``levanter_mars.optim.cpu_write_order``): a value that is its scale on
every platform and, on XLA:CPU only, depends on the tensors it must be written after."""

import jax
import jax.numpy as jnp
import numpy as np

from levanter_mars.optim.cpu_write_order import ordered_on_cpu
from tests.helpers.platform_branch import branch  # noqa: F401  (a fixture)


def test_ordered_on_cpu_is_its_scale_depending_on_its_dependencies_on_cpu_only(branch):
    """Its value is the scale; on XLA:CPU it also depends on each dependency by data (what keeps XLA:CPU from copying
    the donated buffers, tests/test_update_traffic.py), elsewhere not at all. A NaN dependency shows which."""
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 4))
    assert float(jax.jit(ordered_on_cpu)(jnp.float32(0.7), x)) == np.float32(0.7)
    with_nan = float(jax.jit(ordered_on_cpu)(jnp.float32(0.7), x, x.at[0, 0].set(jnp.nan)))
    assert np.isnan(with_nan) if branch == "cpu" else with_nan == np.float32(0.7)
