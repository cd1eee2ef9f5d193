"""The public optax API of levanter_mars.optim.mars: errors, state layout, dtypes, schedules."""

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter_mars.optim import ScaleByMarsState, mars, mars_m, scale_by_mars, scale_by_mars_m


def _params():
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    return {
        "w": jax.random.normal(key1, (16, 8)),
        "v": jax.random.normal(key2, (8,)),
    }


def _mars_state(state) -> ScaleByMarsState:
    (found,) = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ScaleByMarsState))
                if isinstance(s, ScaleByMarsState)]
    return found


def _buffer_of(buffer, param) -> bool:
    """A state buffer held for ``param`` (an absent one is ``optax.MaskedNode``, never ``None``)."""
    return isinstance(buffer, jax.Array) and buffer.shape == param.shape


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def test_exact_without_obj_fn_raises_clear_error():
    params = _params()
    tx = mars(1e-3, exact=True)
    state = tx.init(params)
    with pytest.raises(ValueError, match="obj_fn"):
        tx.update(params, state, params)


def test_exact_without_params_raises():
    params = _params()
    tx = mars(1e-3, exact=True)
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params), None, obj_fn=lambda p: 0.0)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(variant="adam"), "variant"),
        (dict(b1=1.0), "b1"),
        (dict(b2=-0.1), "b2"),
        (dict(b1_1d=1.2), "b1_1d"),
        (dict(b2_1d=1.0), "b2_1d"),
        (dict(gamma=1.5), "gamma"),
        (dict(gamma=-0.01), "gamma"),
        (dict(eps=-1.0), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(weight_decay_1d=-0.1), "weight_decay_1d"),
        (dict(learning_rate_1d=-1e-3), "learning_rate_1d"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(max_grad_norm=float("inf")), "max_grad_norm"),
        (dict(learning_rate_1d=float("inf")), "learning_rate_1d"),
        (dict(weight_decay=float("nan")), "weight_decay"),
        (dict(gamma=float("nan")), "gamma"),
        # optax.inject_hyperparams passes arrays: concrete ones are checked too (traced ones cannot be).
        (dict(b1=jnp.asarray(1.0)), "b1"),
        (dict(max_grad_norm=jnp.asarray(0.0)), "max_grad_norm"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} "):
        mars(1e-3, **kwargs)


@pytest.mark.parametrize("learning_rate", [-1e-3, float("inf"), float("nan")])
def test_negative_or_non_finite_learning_rate_raises(learning_rate):
    with pytest.raises(ValueError, match="^learning_rate "):
        mars(learning_rate)


def test_state_layout_per_variant():
    params = _params()
    adamw = _mars_state(mars(1e-3).init(params))
    assert _buffer_of(adamw.nu["w"], params["w"]) and _buffer_of(adamw.prev["w"], params["w"])
    assert isinstance(adamw.prev["v"], optax.MaskedNode)  # the AdamW branch needs no previous gradient
    for variant in ("lion", "shampoo"):
        state = _mars_state(mars(1e-3, variant=variant).init(params))
        assert isinstance(state.nu["w"], optax.MaskedNode), variant  # no second moment for Lion/Shampoo matrices
        assert _buffer_of(state.nu["v"], params["v"]), variant  # the AdamW branch keeps one


def _paths(tree) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@pytest.mark.parametrize("variant", ["adamw", "lion", "shampoo"])
def test_amsgrad_keeps_one_buffer_where_there_is_a_second_moment_and_none_without_it(variant):
    """Without amsgrad the state stores the same leaves under the same paths as before amsgrad existed (old
    checkpoints load); with it, one nu_max per nu."""
    params = _params()
    off = _mars_state(mars(1e-3, variant=variant).init(params))
    assert not [p for p in _paths(off) if "nu_max" in p]
    assert _paths(off) == [p for p in _paths(off) if p.split(".")[1].split("[")[0] in ("count", "mu", "nu", "prev")]
    on = _mars_state(mars(1e-3, variant=variant, amsgrad=True).init(params))
    assert _paths(on.nu_max) == _paths(on.nu)
    assert _nbytes(on) == _nbytes(off) + _nbytes(off.nu)
    tx = mars(1e-3, variant=variant, amsgrad=True)
    _, state = jax.jit(tx.update)(params, tx.init(params), params)
    assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))


def test_exact_stores_previous_parameters_not_gradients():
    params = _params()
    approx = _mars_state(mars(1e-3).init(params))
    exact = _mars_state(mars(1e-3, exact=True).init(params))
    np.testing.assert_array_equal(exact.prev["w"], params["w"])
    # Same buffers as approx per MARS tensor; the only extra is the (1-D) parameters that obj_fn also needs.
    assert _nbytes(exact) == _nbytes(approx) + params["v"].nbytes


def test_bf16_buffers_halve_mu_and_prev():
    params = _params()
    state = _mars_state(mars(1e-3, mu_dtype=jnp.bfloat16, prev_dtype=jnp.bfloat16).init(params))
    assert state.mu["w"].dtype == jnp.bfloat16 and state.prev["w"].dtype == jnp.bfloat16
    assert state.nu["w"].dtype == jnp.float32
    tx = mars(1e-3, mu_dtype=jnp.bfloat16, prev_dtype=jnp.bfloat16)
    s = tx.init(params)
    updates, s = tx.update(params, s, params)
    assert _mars_state(s).mu["w"].dtype == jnp.bfloat16
    assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))


def test_bf16_state_is_at_most_adamw_fp32_bytes_per_param_on_gpt2():
    from levanter.models.gpt2 import Gpt2Config

    model = Gpt2Config(seq_len=32, hidden_dim=32, num_layers=2, num_heads=2).build(
        hax.Axis("vocab", 64), key=jax.random.PRNGKey(0)
    )
    params = eqx.filter(model, eqx.is_inexact_array)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    bf16 = _mars_state(mars(1e-3, mu_dtype=jnp.bfloat16, prev_dtype=jnp.bfloat16).init(params))
    fp32 = _mars_state(mars(1e-3).init(params))
    adamw = optax.adamw(1e-3).init(params)
    assert _nbytes(bf16) / n_params <= _nbytes(adamw) / n_params <= 8.0 + 1e-3
    assert _nbytes(fp32) / n_params > 8.0


def test_default_learning_rate_1d_is_half_including_schedules():
    params = {"v": jnp.ones(4)}
    grads = {"v": jnp.ones(4)}
    schedule = optax.linear_schedule(1.0, 0.0, 10)
    for lr, expected in ((0.2, 0.1), (schedule, 0.5)):
        tx = mars(lr, weight_decay_1d=0.0)
        updates, _ = tx.update(grads, tx.init(params), params)
        # AdamW's first step moves each coordinate by exactly the learning rate.
        np.testing.assert_allclose(updates["v"], -expected, rtol=1e-5)


def test_gamma_schedule_is_evaluated_per_step():
    params = {"w": jnp.zeros((4, 4))}
    seen = []

    def gamma(count):
        seen.append(count)
        return 0.025

    tx = mars(1e-3, gamma=gamma)
    state = tx.init(params)
    tx.update({"w": jnp.ones((4, 4))}, state, params)
    assert seen


def test_works_with_inject_hyperparams():
    params = _params()
    tx = optax.inject_hyperparams(mars)(learning_rate=1e-3, gamma=0.05)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(params, state, params)
    assert float(state.hyperparams["gamma"]) == pytest.approx(0.05)
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))


def test_step_one_uses_zero_previous_gradient_in_exact_mode():
    """At step 1 exact and approx must agree (both start from g_prev = 0, though the gradient at the previous
    parameters is not zero): the same update, and the first moment m_1 = (1 - b1) c_1 with
    c_1 = Clip((1 + gamma b1 / (1 - b1)) g_1), written out here. The moment is checked, not only the update: Adam's
    first update is about sign(c_1), whatever c_1's scale, so a wrong g_prev hardly moves it."""
    params = _params()
    # Small enough that the clip does not fire: it would bring any c_1 to norm 1, whatever g_prev.
    loss = lambda p: 1e-3 * sum(jnp.sum(x**2) for x in jax.tree.leaves(p))  # noqa: E731
    grads = jax.grad(loss)(params)
    approx, exact = mars(1e-2), mars(1e-2, exact=True)
    u_approx, s_approx = approx.update(grads, approx.init(params), params)
    u_exact, s_exact = exact.update(grads, exact.init(params), params, obj_fn=loss)
    for a, b in zip(jax.tree.leaves(u_approx), jax.tree.leaves(u_exact)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    b1, gamma = 0.95, 0.025  # mars's defaults
    c = (1 + gamma * b1 / (1 - b1)) * grads["w"]
    assert float(jnp.linalg.norm(c)) < 1.0
    for state in (s_approx, s_exact):
        np.testing.assert_allclose(_mars_state(state).mu["w"], (1 - b1) * c, rtol=1e-6)


def test_scale_by_mars_alone_has_no_learning_rate():
    params = {"w": jnp.ones((2, 2))}
    tx = scale_by_mars("lion")
    updates, _ = tx.update({"w": jnp.ones((2, 2))}, tx.init(params), params)
    np.testing.assert_array_equal(updates["w"], jnp.ones((2, 2)))  # sign of a positive momentum


class ClippedObjective:
    """An ``obj_fn`` whose gradient is passed through ``optax.clip_by_global_norm``: the reference for the clip that
    exact mode applies to its second gradient (``objective_gradient`` uses ``value_and_grad`` when there is one)."""

    def __init__(self, fn, max_norm):
        self.fn, self.clip = fn, optax.clip_by_global_norm(max_norm)

    def __call__(self, params):
        return self.fn(params)

    def value_and_grad(self, params):
        value, grads = jax.value_and_grad(self.fn)(params)
        return value, self.clip.update(grads, self.clip.init(grads))[0]


def _objective(params):
    return sum(jnp.sum(jnp.cos(x) * 20.0) for x in jax.tree.leaves(params))


# (family, keyword arguments): MARS's variants and MARS-M, approx and exact.
CLIP_CASES = {
    "mars-adamw": (scale_by_mars, dict(variant="adamw")),
    "mars-lion": (scale_by_mars, dict(variant="lion")),
    "mars-adamw-exact": (scale_by_mars, dict(variant="adamw", exact=True)),
    "mars-m": (scale_by_mars_m, dict()),
    "mars-m-exact": (scale_by_mars_m, dict(exact=True)),
}
#: Gradient sizes over the steps: far above the limits, then (step 2) below both, so that the clip must act and
#: must also leave a small gradient alone.
GRADIENT_SCALES = (30.0, 60.0, 1e-3, 90.0)


@pytest.mark.parametrize("max_norm", [0.3, 1.0])
@pytest.mark.parametrize("case", sorted(CLIP_CASES))
def test_folded_global_clip_equals_optax_clip_before_an_unclipped_transform(case, max_norm):
    """``max_grad_norm`` (folded into the transformation, issue 14) against the reference of optax: its
    ``clip_by_global_norm`` chained before the same transformation *without* a clip, and in exact mode an objective
    whose gradient optax clips too. Same directions and same state (stored previous gradient included), step after
    step; a factor off, or one ignoring ``max_norm``, fails at either limit."""
    family, kwargs = CLIP_CASES[case]
    exact = kwargs.get("exact", False)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(keys[0], (16, 8)), "u": jax.random.normal(keys[1], (8, 24)),
              "v": jax.random.normal(keys[2], (8,))}
    folded = family(**kwargs, max_grad_norm=max_norm)
    reference = optax.chain(optax.clip_by_global_norm(max_norm), family(**kwargs))
    folded_state, reference_state = folded.init(params), reference.init(params)
    for step, scale in enumerate(GRADIENT_SCALES):
        grads = jax.tree.map(lambda x: scale * jnp.sin(x + step), params)
        ours, folded_state = folded.update(grads, folded_state, params, **({"obj_fn": _objective} if exact else {}))
        objective = {"obj_fn": ClippedObjective(_objective, max_norm)} if exact else {}
        expected, reference_state = reference.update(grads, reference_state, params, **objective)
        for a, b in zip(jax.tree.leaves((ours, folded_state)), jax.tree.leaves((expected, reference_state[1]))):
            # Float rounding only (the clip is one product here, a division and a product in optax), relative to each
            # tensor's largest entry as in the golden tests.
            assert np.max(np.abs(a - b)) <= CLIP_TOLERANCE * max(np.max(np.abs(b)), 1e-30), (case, step, a, b)
        params = jax.tree.map(lambda p, u: p - 1e-2 * u, params, ours)


CLIP_TOLERANCE = 2e-6


@pytest.mark.parametrize("make", [lambda: mars(1e-2), lambda: mars(1e-2, max_grad_norm=1.0, variant="shampoo"),
                                  lambda: mars_m(1e-2)], ids=["mars", "mars-shampoo-clipped", "mars-m"])
def test_float64_parameters_train_in_float64(make):
    """With jax_enable_x64, float64 parameters keep float64 updates and state (the CPU and default forms of
    cpu_write_order.ordered_on_cpu used to disagree on the dtype: a TypeError at trace time)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float64).reshape(3, 4), "b": jnp.ones(3, jnp.float64)}
        tx = make()

        @jax.jit
        def step(params, state):
            updates, state = tx.update(jax.tree.map(lambda x: 0.5 * x, params), state, params)
            return optax.apply_updates(params, updates), state

        params, state = step(params, tx.init(params))
        assert {x.dtype for x in jax.tree.leaves((params, state)) if x.ndim} == {jnp.dtype(jnp.float64)}
    finally:
        jax.config.update("jax_enable_x64", previous)
