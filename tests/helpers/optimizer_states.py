"""Optimizer states written by an earlier main, kept in tests/data for tests/test_checkpoint_migrations.py.

Recorded with that main's own ``mars()``/``mars_m()``, read from git history (``levanter_mars.bench.baseline``'s
loader): from ``params()``, two steps on ``grads(params, step)``; the state written as Levanter writes a checkpoint
(``<case>/state``); the parameters after them, the state's leaves and the third step's updates in
``<case>/reference.npz``. The test then needs no git history (CI may run on a shallow clone). To record again, in a
clone that has ``OLD_MAIN``::

    python -m tests.helpers.optimizer_states
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tests.helpers.training import REPO

OLD_MAIN = "f18f19f"  # the last main with the identity slot; 949b23f's layout is the same (test_checkpoint_upgrade)
DIRECTORY = REPO / "tests" / "data" / f"optimizer_states_{OLD_MAIN}"
#: ``case(mars, mars_m)``: the optimizer, from a given main's ``mars`` and ``mars_m``.
CASES = {
    "mars-adamw": lambda mars, mars_m: mars(1e-2, weight_decay=0.1, max_grad_norm=1.0),
    "mars-lion": lambda mars, mars_m: mars(1e-3, variant="lion"),
    "mars-m": lambda mars, mars_m: mars_m(1e-2, weight_decay=0.1),
}
STEPS = 2


def params() -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return {"w": jax.random.normal(keys[0], (16, 8)), "u": jax.random.normal(keys[1], (8, 24)),
            "b": jax.random.normal(keys[2], (8,))}


def grads(params: dict, step: int) -> dict:
    return jax.tree.map(lambda x: jnp.sin(3.0 * x + step), params)


@dataclass(frozen=True)
class Recorded:
    state: Path
    """The stored state (tensorstore, as a checkpoint holds it)."""
    params: dict
    """After the two steps."""
    leaves: list
    """The state's leaves, in the earlier main's order."""
    next_updates: list
    """The earlier main's third step, leaves in order."""


def load(case: str) -> Recorded:
    directory = DIRECTORY / case
    if not (directory / "reference.npz").exists():
        raise FileNotFoundError(f"{directory}: not recorded; see tests/helpers/optimizer_states.py")
    with np.load(directory / "reference.npz") as npz:
        count = json.loads(str(npz["meta"]))
        params = {name: jnp.asarray(npz[f"params/{name}"]) for name in count["params"]}
        leaves = [npz[f"leaf/{i}"] for i in range(count["leaves"])]
        updates = [npz[f"next/{i}"] for i in range(count["next"])]
    return Recorded(directory / "state", params, leaves, updates)


def record(case: str, old_optim: Any) -> None:
    """Runs the earlier main's optimizer for ``case`` and writes what the test holds today's to."""
    from levanter.tensorstore_serialization import tree_serialize_leaves_tensorstore

    old = CASES[case](old_optim.mars, old_optim.mars_m)
    p = params()
    state = old.init(p)
    for step in range(STEPS):
        updates, state = old.update(grads(p, step), state, p)
        p = optax.apply_updates(p, updates)
    assert type(state[1]).__name__ == "ScaleByMarsState", "not the layout with the identity slot"
    next_updates, _ = old.update(grads(p, STEPS), state, p)
    directory = DIRECTORY / case
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    tree_serialize_leaves_tensorstore(str(directory / "state"), state)
    leaves, updates = jax.tree.leaves(state), jax.tree.leaves(next_updates)
    np.savez(
        directory / "reference.npz",
        meta=json.dumps({"main": OLD_MAIN, "params": sorted(p), "leaves": len(leaves), "next": len(updates)}),
        **{f"params/{name}": np.asarray(value) for name, value in p.items()},
        **{f"leaf/{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)},
        **{f"next/{i}": np.asarray(u) for i, u in enumerate(updates)},
    )


if __name__ == "__main__":
    from levanter_mars.bench.baseline import load_optim

    earlier = load_optim(OLD_MAIN)
    for name in CASES:
        record(name, earlier)
        print(f"recorded {DIRECTORY / name}")
