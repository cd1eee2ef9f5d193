"""Parity with the official PyTorch MARS (AGI-Arena/MARS) on the reference trajectories."""

import jax.numpy as jnp
import numpy as np
import pytest

from levanter_mars.optim import mars
from tests.helpers.golden import CASES, load_case, max_relative_errors

# The tolerances of tests/data/golden_mars/README.md.
TOLERANCE = {"adamw": 2e-5, "lion": 2e-5, "shampoo": 5e-2}


def test_all_reference_cases_are_present():
    assert set(CASES) == {
        "adamw_approx",
        "adamw_approx_opt1d",
        "adamw_exact",
        "adamw_gamma_big",
        "adamw_noclip",
        "lion_approx",
        "shampoo_approx",
    }


@pytest.mark.parametrize("name", CASES)
def test_matches_reference_trajectory(name):
    case = load_case(name)
    variant = case.mars_kwargs()["variant"]
    errors = max_relative_errors(case)
    assert max(errors.values()) < TOLERANCE[variant], errors


def test_exact_differs_from_approx_on_the_exact_case():
    """Guards the exact-mode test: the two corrections must give measurably different trajectories."""
    case = load_case("adamw_exact")
    kwargs = case.mars_kwargs() | {"exact": False}
    errors = max_relative_errors(case, mars(case.meta["hp"]["lr"], **kwargs))
    assert max(errors.values()) > 1e-4, errors


def test_clip_fires_in_the_clip_case_and_matters():
    """Without the per-tensor clip of c_t the clipping case must fail, so that case really tests the clip."""
    case = load_case("adamw_approx")
    g = {n: case.batch("a", 0)[n] * (jnp.asarray(case.data[f"init/{n}"]) - case.batch("t", 0)[n]) for n in case.names}
    norms = {n: float(jnp.linalg.norm(g[n])) for n in ("w_tall", "w_wide", "w_square")}
    assert max(norms.values()) > 1.0, norms
    noclip = load_case("adamw_noclip")
    g0 = {
        n: noclip.batch("a", 0)[n] * (jnp.asarray(noclip.data[f"init/{n}"]) - noclip.batch("t", 0)[n])
        for n in ("w_tall", "w_wide", "w_square")
    }
    assert all(float(jnp.linalg.norm(v)) < 1.0 for v in g0.values())


def test_shampoo_case_is_not_matched_by_adamw():
    case = load_case("shampoo_approx")
    kwargs = case.mars_kwargs() | {"variant": "adamw"}
    errors = max_relative_errors(case, mars(case.meta["hp"]["lr"], **kwargs))
    assert np.max([errors[n] for n in ("w_tall", "w_wide", "w_square")]) > 0.1
