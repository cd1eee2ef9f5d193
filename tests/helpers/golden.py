"""Replays the official PyTorch MARS reference trajectories (tests/data/golden_mars) through levanter_mars."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from levanter_mars.optim import mars

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden_mars"
CASES = sorted(p.stem for p in GOLDEN_DIR.glob("*.npz"))
MARS_M_GOLDEN_DIR = GOLDEN_DIR.with_name("golden_mars_m")
MARS_M_CASES = sorted(p.stem for p in MARS_M_GOLDEN_DIR.glob("*.npz"))


@dataclass
class GoldenCase:
    name: str
    meta: dict
    data: dict

    @property
    def names(self) -> list[str]:
        return self.meta["names"]

    @property
    def steps(self) -> int:
        return self.meta["steps"]

    def batch(self, key: str, step: int) -> dict[str, jnp.ndarray]:
        return {n: jnp.asarray(self.data[f"{key}/{n}"][step]) for n in self.names}

    def mars_kwargs(self) -> dict:
        """The reference's hyperparameter names translated to levanter_mars.optim.mars."""
        hp = self.meta["hp"]
        kwargs = dict(
            variant=hp["mars_type"].removeprefix("mars-"),
            b1=hp["betas"][0],
            b2=hp["betas"][1],
            eps=self.meta["eps"],
            gamma=hp["gamma"],
            weight_decay=hp["weight_decay"],
            optimize_1d=hp["optimize_1d"],
            exact=self.meta["exact"],
            # Cases recorded before amsgrad existed ran the reference's default, which is off.
            amsgrad=self.meta.get("amsgrad", False),
        )
        if "lr_1d" in hp:
            kwargs.update(
                learning_rate_1d=hp["lr_1d"],
                b1_1d=hp["betas_1d"][0],
                b2_1d=hp["betas_1d"][1],
                weight_decay_1d=hp["weight_decay_1d"],
            )
        return kwargs


def load_case(name: str, directory: Path = GOLDEN_DIR) -> GoldenCase:
    with np.load(directory / f"{name}.npz") as npz:
        data = {k: npz[k] for k in npz.files}
    return GoldenCase(name, json.loads(str(data.pop("meta"))), data)


def quadratic_loss(names, a, t):
    """f(x) = sum 0.5 * a * (x - t)^2 over every tensor: the golden problem's per-step loss."""

    def loss(params):
        return sum(jnp.sum(0.5 * a[n] * (params[n] - t[n]) ** 2) for n in names)

    return loss


def max_relative_errors(case: GoldenCase, tx: optax.GradientTransformation | None = None) -> dict[str, float]:
    """Runs the case and returns, per tensor, the worst error relative to that tensor's largest magnitude."""
    tx = tx or mars(case.meta["hp"]["lr"], **case.mars_kwargs())
    params = {n: jnp.asarray(case.data[f"init/{n}"]) for n in case.names}
    state = tx.init(params)

    @jax.jit
    def step(params, state, a, t):
        loss = quadratic_loss(case.names, a, t)
        grads = jax.grad(loss)(params)
        updates, state = tx.update(grads, state, params, obj_fn=loss)
        return optax.apply_updates(params, updates), state

    worst = {n: 0.0 for n in case.names}
    for i in range(case.steps):
        params, state = step(params, state, case.batch("a", i), case.batch("t", i))
        for n in case.names:
            reference = case.data[f"traj/{n}"][i]
            error = np.max(np.abs(np.asarray(params[n]) - reference)) / np.max(np.abs(reference))
            worst[n] = max(worst[n], float(error))
    return worst
