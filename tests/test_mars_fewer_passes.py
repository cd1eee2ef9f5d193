"""The restructurings for memory traffic (``levanter_mars.optim.fewer_passes``) against their plain forms, computed
independently in float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter_mars.optim.fewer_passes import corrected_gradient_and_norm, norm_from_dot_products, squared_norm
from tests.helpers.platform_branch import branch  # noqa: F401  (a fixture)

EPS32 = float(np.finfo(np.float32).eps)


def _pair(shape, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(k1, shape), jax.random.normal(k2, shape)


@pytest.mark.parametrize("shape", [(64, 48), (3, 32, 16), (5000, 77)])
def test_squared_norm_is_the_sum_of_squares(shape):
    x, _ = _pair(shape)
    reference = np.sum(np.asarray(x, np.float64) ** 2)
    assert abs(float(squared_norm(x)) - reference) <= 1e-6 * reference


@pytest.mark.parametrize("shape", [(64, 48), (3, 32, 16)])
@pytest.mark.parametrize("a,b", [(1.475, -0.475), (0.3 * 1.475, -0.475), (2.0, 0.0)])
def test_norm_from_dot_products_is_the_norm_of_the_sum(shape, a, b):
    g, g_prev = _pair(shape)
    reference = np.linalg.norm(a * np.asarray(g, np.float64) + b * np.asarray(g_prev, np.float64))
    assert abs(float(jax.jit(norm_from_dot_products)(g, g_prev, a, b)) - reference) <= 1e-6 * reference


def test_norm_from_dot_products_error_when_the_sum_cancels_stays_within_its_bound():
    """c = a g + b g_prev much shorter than g: the error is bounded by float32 epsilon times a^2|g|^2 + b^2|g_prev|^2
    (over 2|c|), the bound the docstring states."""
    g, noise = _pair((128, 64), seed=3)
    a, b = 1.475, -0.475
    g_prev = (a / -b) * g + 1e-3 * noise  # a g + b g_prev = -b * 1e-3 * noise
    g64, p64 = np.asarray(g, np.float64), np.asarray(g_prev, np.float64)
    reference = np.linalg.norm(a * g64 + b * p64)
    got = float(jax.jit(norm_from_dot_products)(g, g_prev, a, b))
    bound = 8 * EPS32 * (a * a * np.sum(g64**2) + b * b * np.sum(p64**2)) / (2 * reference)
    assert abs(got - reference) <= bound, (got, reference, bound)


@pytest.mark.parametrize("clips", [(1.0, 1.0), (0.25, 0.5), (1.0, 0.0)])
def test_corrected_gradient_and_norm_is_the_corrected_gradient_and_its_norm(clips, branch):
    g, g_prev = _pair((40, 24), seed=1)
    gamma, beta = 0.025, 0.95
    c, norm = jax.jit(lambda g, p: corrected_gradient_and_norm(g, p, gamma, beta, clips=clips))(g, g_prev)
    g64, p64 = clips[0] * np.asarray(g, np.float64), clips[1] * np.asarray(g_prev, np.float64)
    want = g64 + gamma * beta / (1 - beta) * (g64 - p64)
    np.testing.assert_allclose(np.asarray(c), want, rtol=1e-6, atol=1e-6 * np.max(np.abs(want)))
    assert abs(float(norm) - np.linalg.norm(want)) <= 1e-6 * np.linalg.norm(want)


def test_without_previous_gradient_the_corrected_gradient_is_the_clipped_gradient():
    g, _ = _pair((8, 8))
    c, norm = corrected_gradient_and_norm(g, None, 0.025, 0.95, clips=(0.5, 1.0))
    np.testing.assert_allclose(np.asarray(c), 0.5 * np.asarray(g), rtol=1e-7)
    assert abs(float(norm) - 0.5 * np.linalg.norm(np.asarray(g, np.float64))) <= 1e-6 * float(norm)
