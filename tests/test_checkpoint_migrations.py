"""Optimizer states in an earlier main's layout load into today's state (training/checkpointing/migrations.py).

The reference is the earlier main's own code: its ``mars()``/``mars_m()``, read from git history (``--baseline-ref``'s
loader), take two steps and their state is written as Levanter writes a checkpoint. Loaded through the migrations
into today's optimizer, every value must be the stored one, and the next step of today's optimizer must be the next
step of the earlier one.
"""

from __future__ import annotations

import logging
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from levanter.tensorstore_serialization import tree_deserialize_leaves_tensorstore, tree_serialize_leaves_tensorstore

from levanter_mars.optim import mars, mars_m
from levanter_mars.training.checkpointing.migrations import CURRENT, LEADING_SLOT, load_in_any_layout
from levanter_mars.training.errors import CheckpointError
from tests.helpers.training import REPO

OLD_MAIN = "f18f19f"  # the last main with the identity slot; 949b23f's layout is the same (test_checkpoint_upgrade)
#: ``case(mars, mars_m)``: the optimizer, from the given main's ``mars`` and ``mars_m``.
CASES = {
    "mars-adamw": lambda mars, mars_m: mars(1e-2, weight_decay=0.1, max_grad_norm=1.0),
    "mars-lion": lambda mars, mars_m: mars(1e-3, variant="lion"),
    "mars-m": lambda mars, mars_m: mars_m(1e-2, weight_decay=0.1),
}
#: The two mains compute the same step; only the chain's numbering differs.
STEP_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def old_optim():
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{OLD_MAIN}^{{commit}}"]).returncode != 0:
        pytest.skip(f"no git history with {OLD_MAIN} to read the earlier optimizer from")
    from levanter_mars.bench.baseline import load_optim

    return load_optim(OLD_MAIN)


def _params():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return {"w": jax.random.normal(keys[0], (16, 8)), "u": jax.random.normal(keys[1], (8, 24)),
            "b": jax.random.normal(keys[2], (8,))}


def _grads(params, step):
    return jax.tree.map(lambda x: jnp.sin(3.0 * x + step), params)


def _load(path, like):
    def load(layout):
        return layout.to_current(tree_deserialize_leaves_tensorstore(str(path), layout.to_stored(like)))

    return load_in_any_layout(str(path), load, state_dir=str(path))  # the optimizer state alone, at the root


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_state_stored_by_the_earlier_main_loads_migrated_and_steps_on(tmp_path, old_optim, case, caplog):
    params = _params()
    old, today = CASES[case](old_optim.mars, old_optim.mars_m), CASES[case](mars, mars_m)
    state = old.init(params)
    for step in range(2):
        updates, state = old.update(_grads(params, step), state, params)
        params = optax.apply_updates(params, updates)
    assert type(state[1]).__name__ == "ScaleByMarsState"  # the layout this test is about
    tree_serialize_leaves_tensorstore(str(tmp_path / "ckpt"), state)

    with caplog.at_level(logging.INFO):
        loaded = _load(tmp_path / "ckpt", today.init(params))
    assert "migrated on load" in caplog.text
    assert jax.tree.structure(loaded) == jax.tree.structure(today.init(params))
    for got, stored in zip(jax.tree.leaves(loaded), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(got, stored)

    expected, _ = old.update(_grads(params, 2), state, params)
    got, _ = today.update(_grads(params, 2), loaded, params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert np.max(np.abs(a - b)) <= STEP_TOLERANCE * np.max(np.abs(b)), (case, a, b)


def test_a_state_in_todays_layout_loads_as_it_is(tmp_path, caplog):
    params = _params()
    optimizer = mars(1e-2)
    _, state = optimizer.update(_grads(params, 0), optimizer.init(params), params)
    tree_serialize_leaves_tensorstore(str(tmp_path / "ckpt"), state)
    with caplog.at_level(logging.INFO):
        loaded = _load(tmp_path / "ckpt", optimizer.init(params))
    assert "migrated" not in caplog.text
    for got, stored in zip(jax.tree.leaves(loaded), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(got, stored)


def test_a_state_in_no_known_layout_is_refused_naming_the_checkpoint(tmp_path):
    params = _params()
    tree_serialize_leaves_tensorstore(str(tmp_path / "adamw"), optax.adamw(1e-3).init(params))
    with pytest.raises(CheckpointError, match=r"adamw matches no known optimizer-state layout") as error:
        _load(tmp_path / "adamw", mars(1e-2).init(params))
    assert CURRENT.name in str(error.value) and LEADING_SLOT.name in str(error.value)


def test_the_layout_maps_are_inverse_and_move_only_the_mars_chain():
    state = optax.inject_hyperparams(lambda learning_rate: mars_m(learning_rate))(learning_rate=1e-2).init(_params())
    stored = LEADING_SLOT.to_stored(state)
    assert isinstance(stored.inner_state[0], optax.EmptyState)
    assert len(stored.inner_state) == len(state.inner_state) + 1
    assert jax.tree.structure(LEADING_SLOT.to_current(stored)) == jax.tree.structure(state)
    adamw = optax.adamw(1e-3).init(_params())  # no MARS chain: nothing to move
    assert jax.tree.structure(LEADING_SLOT.to_stored(adamw)) == jax.tree.structure(adamw)


def _load_like_the_trainer(path, like):
    """As the trainer loads: Levanter's ``load_checkpoint`` of a state whose optimizer state is under ``opt_state``."""
    from levanter.checkpoint import load_checkpoint

    def load(layout):
        tree = {"model": {"w": like["w"]}, "opt_state": layout.to_stored(like["opt"])}
        stored = load_checkpoint(tree, str(path), discover_latest=False)
        return layout.to_current(stored["opt_state"])

    return load_in_any_layout(str(path), load)


def test_only_missing_optimizer_state_paths_mean_another_layout(tmp_path):
    """A missing checkpoint, a storage failure or a model path that is not stored is reported as itself. On 4cb100e
    every FileNotFoundError sent the load on to the next layout, and the run was told the checkpoint "matches no known
    optimizer-state layout"."""
    params = _params()
    opt = mars(1e-2).init(params)
    like = {"w": params["w"], "opt": opt}
    tree_serialize_leaves_tensorstore(str(tmp_path / "ok"), {"model": {"w": params["w"]}, "opt_state": opt})
    np.testing.assert_array_equal(jax.tree.leaves(_load_like_the_trainer(tmp_path / "ok", like))[0],
                                  jax.tree.leaves(opt)[0])  # fmt: skip

    with pytest.raises(FileNotFoundError, match="Could not find checkpoint"):  # a run directory that is not there
        _load_like_the_trainer(tmp_path / "gone", like)

    tree_serialize_leaves_tensorstore(str(tmp_path / "other-model"), {"model": {"v": params["w"]}, "opt_state": opt})
    with pytest.raises(FileNotFoundError, match=r"Missing paths: .*other-model/model/w"):
        _load_like_the_trainer(tmp_path / "other-model", like)

    def storage_blip(layout):
        raise FileNotFoundError("[Errno 2] 503 Service Unavailable: gs://bucket/run/step-10/opt_state/.zarray")

    with pytest.raises(FileNotFoundError, match="503"):
        load_in_any_layout(str(tmp_path / "ok"), storage_blip)
