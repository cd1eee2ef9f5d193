"""Parity with the official PyTorch MARS and MARS-M on a Llama layer and a Mixtral MoE block, per expert.

tests/data/golden_families/ holds the official optimizers' trajectories on the torch view of the two blocks (stacked
over 2 layers; see generate.py there). Here the Levanter modules themselves, with their named axes, layer axis and
experts axis, are trained by levanter_mars with its default roles on the same per-tensor quadratic, and their torch
view (Levanter's own HF state dict) is held to the reference at every step, within the GPT-2 golden tolerances.
"""

from __future__ import annotations

import equinox as eqx
import haliax.nn as hnn
import jax
import numpy as np
import pytest
from haliax.state_dict import from_torch_compatible_state_dict, to_torch_compatible_state_dict
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer
from levanter.models.mixtral import MixtralConfig, MixtralSparseMoeBlock

from levanter_mars.optim import mars
from levanter_mars.optim.tensor_roles import _MODULE_RULES
from tests.helpers.golden import GOLDEN_DIR, load_case
from tests.helpers.quadratic import quadratic_step
from tests.test_mars_m_golden import _mars_m

FAMILY_GOLDEN_DIR = GOLDEN_DIR.with_name("golden_families")
CASES = sorted(p.stem for p in FAMILY_GOLDEN_DIR.glob("*.npz"))
# The tolerances of tests/data/golden_mars/README.md and tests/data/golden_mars_m/README.md.
MARS_TOLERANCE = 2e-5
MARS_M_MATRIX_TOLERANCE, MARS_M_ADAMW_TOLERANCE = 1e-2, 1e-5


def _template(block: str):
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    if block == "llama_layer":
        config = LlamaConfig(seq_len=16, hidden_dim=8, intermediate_dim=24, num_layers=2, num_heads=4, num_kv_heads=2)
        return hnn.Stacked.init(config.Layers, LlamaDecoderLayer)(config, key=keys)
    config = MixtralConfig(
        seq_len=16, hidden_dim=8, intermediate_dim=12, num_layers=2, num_heads=4, num_kv_heads=2, n_routed_experts=4
    )
    return hnn.Stacked.init(config.Layers, MixtralSparseMoeBlock)(config, key=keys)


def _optimizer(case):
    if case.meta["reference"].startswith("MARS_M/"):
        return _mars_m(case, matrix_mask=None)  # our default roles, not the reference's by-name list
    return mars(case.meta["hp"]["lr"], **case.mars_kwargs())


def max_relative_errors(name: str) -> tuple[dict[str, float], dict]:
    case = load_case(name, FAMILY_GOLDEN_DIR)
    template = _template(case.meta["block"])
    torch_names = set(to_torch_compatible_state_dict(template))
    assert torch_names == set(case.names), "the golden data's torch view is this module's"

    def module(prefix: str, step: int | None = None):
        arrays = {n: np.asarray(case.data[f"{prefix}/{n}"] if step is None else case.data[f"{prefix}/{n}"][step])
                  for n in case.names}
        return eqx.filter(from_torch_compatible_state_dict(template, arrays), eqx.is_inexact_array)

    params = module("init")
    tx = _optimizer(case)
    state = tx.init(params)

    step = jax.jit(quadratic_step(tx))

    worst = {n: 0.0 for n in case.names}
    for i in range(case.steps):
        params, state = step(params, state, module("a", i), module("t", i))
        view = to_torch_compatible_state_dict(params)
        for n in case.names:
            reference = case.data[f"traj/{n}"][i]
            error = np.max(np.abs(np.asarray(view[n]) - reference)) / np.max(np.abs(reference))
            worst[n] = max(worst[n], float(error))
    return worst, case.meta


def _check(worst: dict[str, float], meta: dict) -> dict[str, float]:
    """The errors above tolerance (empty when the case passes)."""
    if meta["reference"].startswith("MARS_M/"):
        tolerance = {n: MARS_M_MATRIX_TOLERANCE if r == "matrix" else MARS_M_ADAMW_TOLERANCE
                     for n, r in meta["roles"].items()}
    else:
        tolerance = {n: MARS_TOLERANCE for n in worst}
    return {n: e for n, e in worst.items() if e >= tolerance[n]}


def test_all_cases_are_present():
    assert CASES == ["llama_layer_mars_adamw", "llama_layer_mars_m", "mixtral_moe_mars_adamw", "mixtral_moe_mars_m"]


@pytest.mark.slow  # compiles each block and its optimizer
@pytest.mark.parametrize("name", CASES)
def test_block_matches_the_official_optimizer_on_its_torch_view(name):
    worst, meta = max_relative_errors(name)
    assert not _check(worst, meta), _check(worst, meta)
    print(name, f"max error {max(worst.values()):.2e}")


@pytest.mark.slow  # runs the MoE reference twice per optimizer (~10 s)
@pytest.mark.parametrize("name", ["mixtral_moe_mars_adamw", "mixtral_moe_mars_m"])
def test_experts_as_vectors_fail_the_reference(name, monkeypatch):
    """Guards the test above: with the experts on the 1-D branch (the old roles), the experts are far off."""
    monkeypatch.delitem(_MODULE_RULES, hnn.MoELinear)
    worst, meta = max_relative_errors(name)
    failing = _check(worst, meta)
    assert {n for n in failing if ".experts." in n} == {n for n in meta["names"] if ".experts." in n}, failing
    assert max(failing.values()) > 1e-2, failing
