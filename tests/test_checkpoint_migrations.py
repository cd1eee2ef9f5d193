"""Optimizer states in an earlier main's layout load into today's state (training/checkpointing/migrations.py).

The reference is the earlier main's own code: its ``mars()``/``mars_m()`` took two steps and their state was written
as Levanter writes a checkpoint, with the third step's updates beside it (tests/data/optimizer_states_f18f19f,
recorded by tests/helpers/optimizer_states.py from git history, so that no test needs that history). Loaded through
the migrations into today's optimizer, every value must be the stored one, and the next step of today's optimizer
must be the next step of the earlier one.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
import optax
import pytest
from levanter.tensorstore_serialization import tree_deserialize_leaves_tensorstore, tree_serialize_leaves_tensorstore

from levanter_mars.optim import mars, mars_m
from levanter_mars.training.checkpointing.migrations import CURRENT, LEADING_SLOT, load_in_any_layout
from levanter_mars.training.errors import CheckpointError
from tests.helpers import optimizer_states
from tests.helpers.optimizer_states import CASES, STEPS, grads

#: The two mains compute the same step; only the chain's numbering differs.
STEP_TOLERANCE = 1e-6


def _load(path, like):
    def load(layout):
        return layout.to_current(tree_deserialize_leaves_tensorstore(str(path), layout.to_stored(like)))

    return load_in_any_layout(str(path), load, state_dir=str(path))  # the optimizer state alone, at the root


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_state_stored_by_the_earlier_main_loads_migrated_and_steps_on(case, caplog):
    recorded = optimizer_states.load(case)
    today = CASES[case](mars, mars_m)
    with caplog.at_level(logging.INFO):
        loaded = _load(recorded.state, today.init(recorded.params))
    assert "migrated on load" in caplog.text
    assert jax.tree.structure(loaded) == jax.tree.structure(today.init(recorded.params))
    for got, stored in zip(jax.tree.leaves(loaded), recorded.leaves, strict=True):
        np.testing.assert_array_equal(got, stored)

    got, _ = today.update(grads(recorded.params, STEPS), loaded, recorded.params)
    for a, b in zip(jax.tree.leaves(got), recorded.next_updates, strict=True):
        assert np.max(np.abs(a - b)) <= STEP_TOLERANCE * np.max(np.abs(b)), (case, a, b)


def test_a_state_in_todays_layout_loads_as_it_is(tmp_path, caplog):
    params = optimizer_states.params()
    optimizer = mars(1e-2)
    _, state = optimizer.update(grads(params, 0), optimizer.init(params), params)
    tree_serialize_leaves_tensorstore(str(tmp_path / "ckpt"), state)
    with caplog.at_level(logging.INFO):
        loaded = _load(tmp_path / "ckpt", optimizer.init(params))
    assert "migrated" not in caplog.text
    for got, stored in zip(jax.tree.leaves(loaded), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(got, stored)


def test_a_state_in_no_known_layout_is_refused_naming_the_checkpoint(tmp_path):
    params = optimizer_states.params()
    tree_serialize_leaves_tensorstore(str(tmp_path / "adamw"), optax.adamw(1e-3).init(params))
    with pytest.raises(CheckpointError, match=r"adamw matches no known optimizer-state layout") as error:
        _load(tmp_path / "adamw", mars(1e-2).init(params))
    assert CURRENT.name in str(error.value) and LEADING_SLOT.name in str(error.value)


def test_the_layout_maps_are_inverse_and_move_only_the_mars_chain():
    injected = optax.inject_hyperparams(lambda learning_rate: mars_m(learning_rate))(learning_rate=1e-2)
    state = injected.init(optimizer_states.params())
    stored = LEADING_SLOT.to_stored(state)
    assert isinstance(stored.inner_state[0], optax.EmptyState)
    assert len(stored.inner_state) == len(state.inner_state) + 1
    assert jax.tree.structure(LEADING_SLOT.to_current(stored)) == jax.tree.structure(state)
    adamw = optax.adamw(1e-3).init(optimizer_states.params())  # no MARS chain: nothing to move
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
    params = optimizer_states.params()
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
