"""Parity with the official PyTorch MARS-M (AGI-Arena/MARS, MARS_M/) on its reference trajectories.

tests/data/golden_mars_m/README.md states the semantics and the tolerances: matrices 1e-2 relative (bf16
Newton-Schulz amplifies last-bit differences), AdamW tensors 1e-5.
"""

import pytest

from levanter_mars.optim import mars_m
from tests.helpers.golden import MARS_M_CASES, MARS_M_GOLDEN_DIR, load_case, max_relative_errors

MATRIX_TOLERANCE = 1e-2
ADAMW_TOLERANCE = 1e-5


def _load(name):
    return load_case(name, MARS_M_GOLDEN_DIR)


def _mars_m(case, **overrides):
    """The reference's hyperparameters and its by-name roles, translated to levanter_mars.optim.mars_m."""
    hp = case.meta["hp"]
    kwargs = dict(
        b1=hp["momentum"],
        gamma=hp["gamma"],
        weight_decay=hp["wd"],
        ns_steps=hp["ns_steps"],
        b1_adamw=hp["adamw_betas"][0],
        b2_adamw=hp["adamw_betas"][1],
        eps=hp["adamw_eps"],
        exact=case.meta["exact"],
        efficient=case.meta["reference"].endswith("mars_m_efficient.py"),
        matrix_mask={n: role == "matrix" for n, role in case.meta["roles"].items()},
    )
    return mars_m(hp["lr"], **(kwargs | overrides))


def _split(case, errors):
    roles = case.meta["roles"]
    matrices = {n: e for n, e in errors.items() if roles[n] == "matrix"}
    adamw = {n: e for n, e in errors.items() if roles[n] == "adamw"}
    return matrices, adamw


def test_all_reference_cases_are_present():
    assert set(MARS_M_CASES) == {"marsm_approx", "marsm_efficient", "marsm_exact", "marsm_gamma_big", "marsm_noclip"}


@pytest.mark.parametrize("name", MARS_M_CASES)
def test_matches_reference_trajectory(name):
    case = _load(name)
    matrices, adamw = _split(case, max_relative_errors(case, _mars_m(case)))
    assert max(matrices.values()) < MATRIX_TOLERANCE, matrices
    assert max(adamw.values()) < ADAMW_TOLERANCE, adamw


@pytest.mark.parametrize(
    "name,overrides,what",
    [
        ("marsm_exact", dict(exact=False), "exact correction"),
        ("marsm_approx", dict(efficient=True), "clip"),
        ("marsm_efficient", dict(efficient=False), "efficient buffer"),
        ("marsm_gamma_big", dict(gamma=0.0), "correction"),
    ],
)
def test_cases_discriminate(name, overrides, what):
    """Without the feature a case tests, its matrices must end up several times further from the reference.

    bf16 Newton-Schulz noise puts the right optimizer about 2e-3 away, and the features move a 25-step trajectory by
    only about 1e-2 (5e-2 for gamma), so the tolerance alone would barely tell them apart: compare the two errors.
    """
    case = _load(name)
    right, _ = _split(case, max_relative_errors(case, _mars_m(case)))
    wrong, _ = _split(case, max_relative_errors(case, _mars_m(case, **overrides)))
    assert max(wrong.values()) > 4 * max(right.values()), (what, right, wrong)

