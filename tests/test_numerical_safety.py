"""NaN/Inf never reach parameters or optimizer state, and one huge gradient cannot wreck MARS's state."""

import jax
import jax.numpy as jnp
import optax
import pytest

from levanter_mars.optim import ScaleByMarsState, mars
from levanter_mars.optim.guard import NonFiniteGuardState, skip_nonfinite_updates


def _params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w": jax.random.normal(k1, (8, 6)), "b": jax.random.normal(k2, (6,))}


def _grads(seed, scale=1.0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w": scale * jax.random.normal(k1, (8, 6)), "b": scale * jax.random.normal(k2, (6,))}


def _mars_state(state) -> ScaleByMarsState:
    return next(s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ScaleByMarsState))
                if isinstance(s, ScaleByMarsState))


def _tree_equal(a, b):
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_nonfinite_gradients_are_skipped_and_counted(bad):
    params = _params()
    tx = skip_nonfinite_updates(mars(1e-2))
    state = tx.init(params)
    updates, state = tx.update(_grads(1), state, params)
    poisoned = _grads(2)
    poisoned["w"] = poisoned["w"].at[3, 2].set(bad)
    skipped_updates, skipped_state = tx.update(poisoned, state, params)
    assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(skipped_updates))
    assert _tree_equal(skipped_state.inner_state, state.inner_state), "state untouched"
    assert int(skipped_state.skipped_steps) == 1 and int(skipped_state.consecutive_skips) == 1
    _, recovered = tx.update(_grads(3), skipped_state, params)
    assert int(recovered.skipped_steps) == 1 and int(recovered.consecutive_skips) == 0


def test_finite_steps_pass_through_unchanged():
    params = _params()
    inner, guarded = mars(1e-2), skip_nonfinite_updates(mars(1e-2))
    s_inner, s_guard = inner.init(params), guarded.init(params)
    for seed in range(3):
        u_inner, s_inner = inner.update(_grads(seed), s_inner, params)
        u_guard, s_guard = guarded.update(_grads(seed), s_guard, params)
        assert _tree_equal(u_inner, u_guard)
    assert int(s_guard.skipped_steps) == 0


def test_a_nonfinite_value_in_the_optimizer_state_is_kept_out_of_what_is_written():
    """Finite gradients, a NaN already in a moment (as only a state from outside could hold): the step is taken, the
    NaN is replaced by zero where it is written, every other value is what the step computes."""
    params = _params()
    tx = skip_nonfinite_updates(mars(1e-2))
    state = tx.init(params)
    _, state = tx.update(_grads(1), state, params)
    mars_state = _mars_state(state)
    broken_mu = {**mars_state.mu, "w": mars_state.mu["w"].at[0, 0].set(jnp.nan)}
    broken = state._replace(inner_state=jax.tree.map(
        lambda s: s._replace(mu=broken_mu) if isinstance(s, ScaleByMarsState) else s, state.inner_state,
        is_leaf=lambda x: isinstance(x, ScaleByMarsState)))  # fmt: skip
    updates, new_state = tx.update(_grads(2), broken, params)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((updates, new_state)))
    assert int(new_state.skipped_steps) == 0 and float(_mars_state(new_state).mu["w"][0, 0]) == 0.0
    _, healthy = tx.update(_grads(2), state, params)
    assert bool(jnp.array_equal(_mars_state(new_state).mu["w"][1:], _mars_state(healthy).mu["w"][1:]))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf])
def test_exact_mode_nonfinite_second_gradient_alone_skips_the_step(bad):
    """The incoming gradients are finite, the loss hook's gradient (at the previous parameters) is not: the guard
    judges that gradient as it is computed, before anything is written: a skipped step, counted as one."""
    params = _params()
    tx = skip_nonfinite_updates(mars(1e-2, exact=True))
    state = tx.init(params)
    fine = lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p))  # noqa: E731
    _, state = tx.update(_grads(1), state, params, obj_fn=fine)

    def broken(p):  # the same loss, with an Inf (or NaN) slope in one entry of one tensor
        return fine(p) + bad * p["w"][0, 0]

    updates, after = jax.jit(lambda g, s, p: tx.update(g, s, p, obj_fn=broken))(_grads(2), state, params)
    assert int(after.skipped_steps) == 1 and int(after.consecutive_skips) == 1
    assert float(after.nonfinite_outputs) == 0.0  # a skipped step writes nothing, so keeps nothing out
    assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))
    assert _tree_equal(after.inner_state, state.inner_state), "no state changes on a skipped step"


def test_an_optimizer_that_overflows_on_finite_inputs_writes_nothing_nonfinite_and_is_counted():
    """optax.trace with a decay of 1e30 overflows float32 by its third step though every gradient is finite: its
    trace is kept at its last finite value, the update (the trace) is zeroed, each value kept is counted as
    nonfinite_outputs, and no step is skipped. Jitted, as in training."""
    params = _params()
    tx = skip_nonfinite_updates(optax.trace(decay=1e30))
    state = tx.init(params)
    step = jax.jit(tx.update)
    for seed in range(4):
        updates, state = step(_grads(seed), state, params)
        params = optax.apply_updates(params, updates)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((params, updates, state)))
    assert int(state.skipped_steps) == 0
    # Steps 3 and 4 overflow every value of the trace (48 + 6) and so every update value: each kept value counted.
    assert float(state.nonfinite_outputs) == 2 * (48 + 6) * 2
    assert float(state.hyperparams["nonfinite_outputs"]) == 216


def test_a_parameter_at_the_edge_of_float_range_keeps_its_value_and_is_counted():
    """Finite updates of +-1e38 (a rate of -1e38: update = 1e38 x gradient): the two parameters at +-3.4e38 they would
    take past float range keep their values (the update there is zeroed), the others move, and exactly those two
    are counted."""
    params = {"w": jnp.array([3.4e38, 3.4e38, 1.0, -3.4e38, 2e38])}
    grads = {"w": jnp.array([1.0, -1.0, 1.0, -1.0, 0.5])}
    raw, _ = optax.sgd(-1e38).update(grads, optax.sgd(-1e38).init(params), params)
    raw_sum = params["w"] + raw["w"]
    assert bool(jnp.all(jnp.isfinite(raw["w"]))) and not bool(jnp.isfinite(raw_sum[0]))  # the premise
    tx = skip_nonfinite_updates(optax.sgd(-1e38))
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    written = optax.apply_updates(params, updates)["w"]
    overflows = jnp.array([True, False, False, True, False])
    assert bool(jnp.array_equal(jnp.isfinite(raw_sum), ~overflows))
    assert bool(jnp.array_equal(written, jnp.where(overflows, params["w"], raw_sum)))
    assert bool(jnp.array_equal(updates["w"], jnp.where(overflows, 0.0, raw["w"])))
    assert float(state.nonfinite_outputs) == 2.0 and int(state.skipped_steps) == 0


def test_a_nonfinite_update_from_finite_gradients_is_zeroed_and_counted():
    """A scale of 1e60 (two of 1e30) makes an Inf update from each non-zero gradient: zeroed, counted one each."""
    params = {"w": jnp.array([1.0, 2.0, 3.0])}
    tx = skip_nonfinite_updates(optax.chain(optax.scale(1e30), optax.scale(1e30)))
    updates, state = tx.update({"w": jnp.array([1.0, 0.0, -2.0])}, tx.init(params), params)
    assert bool(jnp.array_equal(updates["w"], jnp.zeros(3)))
    assert float(state.nonfinite_outputs) == 2.0 and int(state.skipped_steps) == 0


def test_each_value_kept_is_counted_once_on_a_small_tree():
    """optax.trace(decay=2) (its update is its new trace) from a state near float's edge, finite gradients:

    * a[0]: the trace (2 x 2e38) overflows, so does the update: the trace and the update value kept: 2;
    * a[2]: a finite update (2e38) that would take its parameter (2e38) past float range: zeroed: 1;
    * a[3]: 3.4e38 + 1 is finite (rounds to 3.4e38): written, not counted;
    * b[0, 0]: the trace (2 x -2e38) overflows downwards, and its update: 2; b[1, 1]: -3.4e38 + 4 is finite.

    5 in all; every value kept holds its previous value, every other one what the step computes."""
    params = {"a": jnp.array([0.0, 0.0, 2e38, 3.4e38]), "b": jnp.array([[0.0, 0.0], [0.0, -3.4e38]])}
    grads = {"a": jnp.ones(4), "b": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
    trace = {"a": jnp.array([2e38, 0.0, 1e38, 0.0]), "b": jnp.array([[-2e38, 0.0], [0.0, 0.0]])}
    tx = skip_nonfinite_updates(optax.trace(decay=2.0))
    state = tx.init(params)
    state = state._replace(inner_state=optax.TraceState(trace=trace))
    updates, new_state = jax.jit(tx.update)(grads, state, params)
    written = optax.apply_updates(params, updates)
    assert float(new_state.nonfinite_outputs) == 5.0 and int(new_state.skipped_steps) == 0
    new_trace = new_state.inner_state.trace
    assert bool(jnp.array_equal(new_trace["a"], jnp.array([2e38, 1.0, 2e38, 1.0])))
    assert bool(jnp.array_equal(new_trace["b"], jnp.array([[-2e38, 2.0], [3.0, 4.0]])))
    assert bool(jnp.array_equal(written["a"], jnp.array([0.0, 1.0, 2e38, 3.4e38])))
    assert bool(jnp.array_equal(written["b"], jnp.array([[0.0, 2.0], [3.0, -3.4e38]])))
    # A second step from there counts on: the running total only grows by what that step kept.
    _, later = jax.jit(tx.update)(grads, new_state, written)
    assert float(later.nonfinite_outputs) > 5.0


def _trainer_optimizer(name: str):
    """The chain the trainer wraps (a rate of 1e38 from the first step, no decay: updates of about +-1e38)."""
    from levanter.optim import AdamConfig

    from levanter_mars.optim.levanter_config import MarsAdamWConfig

    common = dict(learning_rate=1e38, warmup=0.0, lr_schedule="constant", weight_decay=0.0)
    if name == "adamw":
        return AdamConfig(**common).build(10)
    return MarsAdamWConfig(learning_rate_1d=1e38, **common).build(10)


@pytest.mark.parametrize("name", ["adamw", "mars-adamw"])
def test_the_trainer_chains_keep_parameters_at_the_edge_and_count_them(name):
    """Through Levanter's AdamW and MARS-AdamW as the trainer builds them: parameters set to 3.4e38 in the direction
    of their update (known from the unguarded chain) keep their value and are counted, exactly; every other parameter
    and the state are what the unguarded chain writes."""
    params, grads = _params(), _grads(1)
    raw_updates, raw_state = _trainer_optimizer(name).update(grads, _trainer_optimizer(name).init(params), params)
    edge = {k: jnp.zeros(v.shape, bool).reshape(-1).at[::5].set(True).reshape(v.shape) for k, v in params.items()}
    params = jax.tree.map(lambda p, u, e: jnp.where(e, 3.4e38 * jnp.sign(u), p), params, raw_updates, edge)
    raw_updates, raw_state = _trainer_optimizer(name).update(grads, _trainer_optimizer(name).init(params), params)
    raw_sums = jax.tree.map(lambda p, u: p + u, params, raw_updates)
    overflowing = sum(int(jnp.sum(~jnp.isfinite(x))) for x in jax.tree.leaves(raw_sums))
    assert overflowing == sum(int(jnp.sum(e)) for e in jax.tree.leaves(edge)) > 0  # the premise
    floats = [x for x in jax.tree.leaves(raw_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in floats)

    tx = skip_nonfinite_updates(_trainer_optimizer(name))
    updates, state = tx.update(grads, tx.init(params), params)  # eager, as the unguarded reference: bitwise alike
    written = optax.apply_updates(params, updates)
    expected = jax.tree.map(lambda p, s: jnp.where(jnp.isfinite(s), s, p), params, raw_sums)
    assert _tree_equal(written, expected)
    assert float(state.nonfinite_outputs) == overflowing and int(state.skipped_steps) == 0
    assert _tree_equal(state.inner_state, raw_state)


def test_guard_keeps_injected_hyperparameters_visible_for_logging():
    params = _params()
    tx = skip_nonfinite_updates(optax.inject_hyperparams(mars)(learning_rate=3e-3))
    state = tx.init(params)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(3e-3)
    assert int(state.hyperparams["skipped_steps"]) == 0 and float(state.hyperparams["nonfinite_outputs"]) == 0


def _distance_to_optimum_after(tx, spike_at=None, steps=80, spike=1e6):
    """Minimizes 0.5 * ||x||^2 from noisy gradients; gradient ``spike_at`` is ``spike`` times too large."""
    params = _params()
    state = tx.init(params)
    update = jax.jit(tx.update)
    for step in range(steps):
        noise = _grads(100 + step, scale=0.1)
        grads = jax.tree.map(lambda x, n: x + n, params, noise)
        if step == spike_at:
            grads = jax.tree.map(lambda g: spike * g, grads)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))
    return float(jnp.linalg.norm(params["w"])), state


def test_per_tensor_clip_keeps_one_huge_gradient_from_wrecking_the_state():
    """A single gradient 1e6x too large, with no global clip in front. MARS clips c_t per tensor, so its moments
    stay bounded and it ends where it would have without the spike. Plain Adam takes a huge step and its second
    moment then remembers the spike for ~1/(1-b2) steps, so it cannot come back."""
    clean_mars, _ = _distance_to_optimum_after(mars(3e-2))
    spiked_mars, spiked_state = _distance_to_optimum_after(mars(3e-2), spike_at=20)
    clean_adam, _ = _distance_to_optimum_after(optax.adam(3e-2))
    spiked_adam, _ = _distance_to_optimum_after(optax.adam(3e-2), spike_at=20)

    mars_state = _mars_state(spiked_state)
    # Every c_t has norm <= 1, so the moments are convex combinations of vectors of norm <= 1.
    assert float(jnp.linalg.norm(mars_state.mu["w"])) <= 1.0 + 1e-6
    assert float(jnp.sum(mars_state.nu["w"])) <= 1.0 + 1e-6
    start = float(jnp.linalg.norm(_params()["w"]))
    assert clean_mars < 0.2 * start, "the problem is solved in 80 steps"
    assert abs(spiked_mars - clean_mars) < 0.01 * start, (spiked_mars, clean_mars)
    assert spiked_adam > 2 * clean_adam, (spiked_adam, clean_adam)


def _four_tensors(seed, scale=1.0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    shapes = {"w1": (16, 8), "w2": (8, 24), "w3": (24, 16), "b": (24,)}
    return {name: scale * jax.random.normal(k, shape) for k, (name, shape) in zip(keys, shapes.items())}


CONTAINMENT_CASES = {
    "approx": dict(),
    "approx-bf16": dict(mu_dtype=jnp.bfloat16, prev_dtype=jnp.bfloat16),
    "exact": dict(exact=True),
}


def _objective(params):
    return sum(jnp.sum(jnp.cos(x)) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("case", sorted(CONTAINMENT_CASES))
def test_a_nonfinite_gradient_in_one_tensor_is_contained(case):
    """NaN in one tensor's gradient, jitted as in training. Guarded (global clip on, as in the configs): the step is
    skipped and no state changes. Unguarded and without the global clip (so the tensors' updates are independent):
    every other tensor's direction and state are exactly those of the same step with that gradient finite, i.e. the
    NaN does not leak through anything the update adds between tensors."""
    kwargs, params = CONTAINMENT_CASES[case], _four_tensors(0)
    extra = {"obj_fn": _objective} if kwargs.get("exact") else {}
    poisoned = _four_tensors(2)
    poisoned["w1"] = poisoned["w1"].at[3, 2].set(jnp.nan)

    guarded = skip_nonfinite_updates(mars(1e-2, max_grad_norm=1.0, **kwargs))
    step = jax.jit(lambda g, s, p: guarded.update(g, s, p, **extra))
    _, state = step(_four_tensors(1), guarded.init(params), params)
    updates, after = step(poisoned, state, params)
    assert int(after.skipped_steps) == 1
    assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))
    assert _tree_equal(after.inner_state, state.inner_state), "no state changes on a skipped step"

    plain = mars(1e-2, max_grad_norm=None, **kwargs)
    step = jax.jit(lambda g, s, p: plain.update(g, s, p, **extra))
    _, state = step(_four_tensors(1), plain.init(params), params)
    healthy = {**poisoned, "w1": _four_tensors(2)["w1"]}
    got, got_state = step(poisoned, state, params)
    want, want_state = step(healthy, state, params)
    got_state, want_state = _mars_state(got_state), _mars_state(want_state)
    for name in ("w2", "w3", "b"):
        for a, b in ((got, want), (got_state.mu, want_state.mu), (got_state.nu, want_state.nu),
                     (got_state.prev, want_state.prev)):
            assert _tree_equal(a[name], b[name]), (case, name)
            assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(a[name])), (case, name)
    assert not bool(jnp.all(jnp.isfinite(got["w1"]))), "the poisoned tensor itself is not finite (no masking)"
