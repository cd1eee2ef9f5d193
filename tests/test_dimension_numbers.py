"""optax-style dimension numbers (``weight_dimension_numbers``) for plain-array models.

The reference is the same layers as separate ``[out, in]`` matrices, which the plain-array rule (and the official
code) treats as matrices: a stacked ``[layers, in, out]`` weight with dimension numbers must follow it layer by layer,
per-layer clip included. A second, independent reference is optax's own Muon given the same dimension numbers.
"""

from __future__ import annotations

import dataclasses
import warnings

import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter_mars.optim import mars, mars_m, mars_param_labels, tensor_roles
from levanter_mars.optim.dimension_numbers import MuonDimensionNumbers, _DimensionNumbers, with_dimension_numbers
from levanter_mars.optim.mars import ADAMW_1D_LABEL, MARS_LABEL
from levanter_mars.optim.role_audit import MATRIX, VECTOR, audit_roles

LAYERS, IN, OUT = 3, 8, 12
#: Per-layer gradient scales: the clip of c_t fires on the last layer only (checked below).
LAYER_SCALES = jnp.array([0.01, 0.3, 30.0])
DIMS = {"w": MuonDimensionNumbers(reduction_axis=1, output_axis=2), "b": None}

OPTIMIZERS = {
    "mars-adamw": lambda **kw: mars(2e-2, weight_decay=0.01, **kw),
    "mars-adamw-exact": lambda **kw: mars(2e-2, weight_decay=0.01, exact=True, **kw),
    "mars-shampoo": lambda **kw: mars(2e-2, variant="shampoo", weight_decay=0.01, **kw),
    "mars-m": lambda **kw: mars_m(2e-2, weight_decay=0.01, **kw),
}
# Relative to how far each tensor moved. AdamW: float32 rounding (measured 5.8e-6: the per-layer norms are summed in
# another order). Newton-Schulz runs in bfloat16 and can amplify such last-bit differences (measured: none here).
TOLERANCE = {"mars-adamw": 2e-5, "mars-adamw-exact": 2e-5, "mars-shampoo": 1e-2, "mars-m": 1e-2}


def _stacked():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w": jax.random.normal(k1, (LAYERS, IN, OUT)), "b": jax.random.normal(k2, (LAYERS, OUT))}


def _separate(tree):
    """The same layers as separate tensors: each weight ``[out, in]``, as torch stores a Linear."""
    return {**{f"w{i}": tree["w"][i].T for i in range(LAYERS)}, **{f"b{i}": tree["b"][i] for i in range(LAYERS)}}


def _batch(step):
    ka, kt = jax.random.split(jax.random.PRNGKey(100 + step))
    curvature = {"w": jnp.abs(jax.random.normal(ka, (LAYERS, IN, OUT))) + 0.5, "b": jnp.ones((LAYERS, OUT))}
    offsets = {"w": jax.random.normal(kt, (LAYERS, IN, OUT)) * LAYER_SCALES[:, None, None],
               "b": jax.random.normal(kt, (LAYERS, OUT))}
    return curvature, offsets


def _loss(a, t):
    return lambda p: sum(jnp.sum(0.5 * a[k] * (p[k] - t[k]) ** 2) for k in p)


def _train(tx, params, view, steps=6):
    """Trains ``view(params)`` with ``tx`` on the quadratics of :func:`_batch` (targets near the start)."""
    params, start = view(params), view(_stacked())

    @jax.jit
    def step(params, state, a, t):
        loss = _loss(a, t)
        updates, state = tx.update(jax.grad(loss)(params), state, params, obj_fn=loss)
        return optax.apply_updates(params, updates), state

    state, trajectory = tx.init(params), []
    for i in range(steps):
        a, offsets = _batch(i)
        params, state = step(params, state, view(a), jax.tree.map(jnp.add, start, view(offsets)))
        trajectory.append(params)
    return trajectory


def _worst_error(stacked_trajectory, separate_trajectory):
    """The worst difference, relative to how far the reference moved that tensor (its largest displacement)."""
    start, worst = _separate(_stacked()), 0.0
    for stacked, separate in zip(stacked_trajectory, separate_trajectory, strict=True):
        for name, value in _separate(stacked).items():
            reference = np.asarray(separate[name])
            moved = np.max(np.abs(reference - np.asarray(start[name])))
            worst = max(worst, float(np.max(np.abs(np.asarray(value) - reference)) / moved))
    return worst


def _errors(name, **stacked_kwargs):
    make = OPTIMIZERS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runs without dimension numbers warn (tested below)
        stacked = _train(make(**stacked_kwargs), _stacked(), lambda tree: tree)
    separate = _train(make(), _stacked(), _separate)
    return _worst_error(stacked, separate)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_stacked_plain_weight_with_dimension_numbers_is_its_layers_as_matrices(name):
    assert _errors(name, weight_dimension_numbers=DIMS) < TOLERANCE[name]


@pytest.mark.parametrize("name", ["mars-adamw", "mars-shampoo", "mars-m"])
def test_without_dimension_numbers_the_stack_is_one_vector_and_far_off(name):
    """Guards the test above: the plain-array rule makes ``[layers, in, out]`` a vector (AdamW, no per-layer clip)."""
    assert _errors(name) > 10 * TOLERANCE[name]


def test_the_clip_fires_on_some_layers_only():
    a, offsets = _batch(0)
    # At step 1 c_t = (1 + gamma b1/(1-b1)) g; the gradient at the start is -a * offsets.
    norms = [float(jnp.linalg.norm(a["w"][i] * offsets["w"][i]) * (1 + 0.025 * 0.95 / 0.05)) for i in range(LAYERS)]
    assert min(norms) < 1.0 < max(norms), norms


def test_rows_are_the_output_axes():
    """Shampoo's factor sqrt(max(1, rows/cols)) sees the orientation: [out, in] is the reference's, not [in, out]."""
    swapped = {"w": MuonDimensionNumbers(reduction_axis=2, output_axis=1), "b": None}
    assert _errors("mars-shampoo", weight_dimension_numbers=swapped) > 10 * TOLERANCE["mars-shampoo"]


def test_mars_m_with_gamma_zero_is_optax_muon_given_the_same_dimension_numbers():
    """An independent reference: MARS-M's efficient form with gamma 0 is Moonlight's Muon without Nesterov, which
    optax's Muon computes with the same dimension numbers (Newton-Schulz in float32 there, bfloat16 here: 2e-2)."""
    dims = {"w": MuonDimensionNumbers(reduction_axis=1, output_axis=2)}
    muon = optax.contrib.muon(1e-2, ns_coeffs=(3.4445, -4.775, 2.0315), ns_steps=5, beta=0.95, eps=1e-7,
                              nesterov=False, consistent_rms=0.2, muon_weight_dimension_numbers=dims)
    params = {"w": _stacked()["w"]}

    def run(tx):
        p, state = params, tx.init(params)
        for i in range(8):
            g = {"w": jax.random.normal(jax.random.PRNGKey(i), p["w"].shape) * LAYER_SCALES[:, None, None]}
            updates, state = tx.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p["w"]

    reference, moved = run(muon), run(muon) - params["w"]
    ours = run(mars_m(1e-2, gamma=0.0, efficient=True, weight_dimension_numbers=dims))
    one_matrix = {"w": MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=2)}
    whole_stack = run(mars_m(1e-2, gamma=0.0, efficient=True, weight_dimension_numbers=one_matrix))
    error = float(jnp.max(jnp.abs(ours - reference)) / jnp.max(jnp.abs(moved)))
    assert error < 5e-2
    assert float(jnp.max(jnp.abs(whole_stack - reference)) / jnp.max(jnp.abs(moved))) > 10 * error


def test_without_dimension_numbers_init_warns_once_naming_the_tensor():
    params = _stacked()
    tx = mars(1e-2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = tx.init(params)
        tx.update(params, state, params)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1 and "['w']" in messages[0] and "weight_dimension_numbers" in messages[0], messages
    assert "['b']" not in messages[0]  # [layers, out] is 2-D: a matrix to the plain-array rule, as in the reference
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mars(1e-2, weight_dimension_numbers=DIMS).init(params)


def test_the_audit_reports_a_stacked_plain_array_and_lists_its_declared_layers():
    params = _stacked()
    undeclared = audit_roles(params, None)
    assert undeclared.branch_of["['w']"] == VECTOR and len(undeclared.warnings) == 1
    declared = audit_roles(params, None, DIMS)
    assert declared.warnings == () and declared.branch_of == {"['w']": MATRIX, "['b']": VECTOR}
    (w,) = [e for e in declared.entries if e.path == "['w']"]
    assert w.per_tensor_axes == ("dim0",) and w.matrix == "(dim2) x (dim1)" and w.shape == "(3, 8, 12)"
    assert {r.branch: r.per_layer for r in declared.rows}[MATRIX] == LAYERS


def test_a_prefix_tree_and_a_callable_declare_like_the_full_tree():
    params = {"w": jnp.zeros((LAYERS, IN, OUT)), "u": jnp.zeros((LAYERS, IN, OUT)), "b": jnp.zeros(OUT)}
    prefix = MuonDimensionNumbers(reduction_axis=-2, output_axis=-1)  # one for every tensor: b must not take it

    with pytest.raises(ValueError, match=r"\['b'\]|the root"):
        mars_param_labels(weight_dimension_numbers=prefix)(params)
    full = {"w": prefix, "u": prefix, "b": None}
    labels = mars_param_labels(weight_dimension_numbers=lambda p: {k: prefix if k != "b" else None for k in p})(params)
    assert labels == mars_param_labels(weight_dimension_numbers=full)(params)
    assert labels == {"w": MARS_LABEL, "u": MARS_LABEL, "b": ADAMW_1D_LABEL}
    ours = _DimensionNumbers(reduction_axis=-2, output_axis=-1)  # where the installed optax has none
    assert mars_param_labels(weight_dimension_numbers={"w": ours, "u": ours, "b": None})(params) == labels


def test_named_arrays_keep_their_rule_unless_given_dimension_numbers():
    Embed, Heads, HeadSize = hax.Axis("embed", 4), hax.Axis("heads", 2), hax.Axis("head_size", 3)
    linear = hnn.Linear.init(In=Embed, Out=(Heads, HeadSize), key=jax.random.PRNGKey(0))
    kept = tensor_roles(linear)
    assert kept.weight.rows == ("heads", "head_size") and kept.weight.layer_axes == ()

    same = with_dimension_numbers(tensor_roles(linear), linear, jax.tree.map(lambda _: None, linear))
    assert same == kept
    per_head = dataclasses.replace(
        linear, weight=MuonDimensionNumbers(reduction_axis="embed", output_axis="head_size"), bias=None
    )
    declared = with_dimension_numbers(tensor_roles(linear), linear, per_head)
    assert declared.weight.rows == ("head_size",) and declared.weight.cols == ("embed",)
    assert declared.weight.layer_axes == ("heads",) and declared.weight.declared
    assert declared.bias == kept.bias


@pytest.mark.parametrize(
    "numbers,params,match",
    [
        (MuonDimensionNumbers(reduction_axis=3, output_axis=2), jnp.zeros((2, 3, 4)), "reduction_axis 3 is out of"),
        (MuonDimensionNumbers(reduction_axis=1, output_axis=(1, 2)), jnp.zeros((2, 3, 4)), "must be distinct"),
        (MuonDimensionNumbers(reduction_axis="in", output_axis=2), jnp.zeros((2, 3, 4)), "'in' is not an axis"),
        (MuonDimensionNumbers(reduction_axis=0, output_axis=0), jnp.zeros(4), "must be distinct"),
        (MuonDimensionNumbers(reduction_axis=(), output_axis=0), jnp.zeros((2, 3)), "reduction_axis is empty"),
    ],
)
def test_bad_dimension_numbers_raise_naming_the_parameter(numbers, params, match):
    with pytest.raises(ValueError, match=rf"weight_dimension_numbers at \['kernel'\]: .*{match}"):
        mars(1e-2, weight_dimension_numbers={"kernel": numbers}).init({"kernel": params})


@pytest.mark.parametrize(
    "numbers",
    [
        MuonDimensionNumbers(reduction_axis=np.int64(1), output_axis=np.int32(2)),
        MuonDimensionNumbers(reduction_axis=(np.int64(1),), output_axis=np.array([2])),
        MuonDimensionNumbers(reduction_axis=np.int8(-2), output_axis=np.uint8(2)),
    ],
    ids=["numpy-scalars", "in-a-tuple-and-an-array", "negative-and-unsigned"],
)
def test_numpy_integers_are_axis_positions_like_ints(numbers):
    params = {"w": jnp.zeros((LAYERS, IN, OUT))}
    as_ints = with_dimension_numbers(tensor_roles(params), params, {"w": MuonDimensionNumbers(1, 2)})
    assert as_ints["w"].rows == ("dim2",) and as_ints["w"].cols == ("dim1",) and as_ints["w"].layer_axes == ("dim0",)
    assert with_dimension_numbers(tensor_roles(params), params, {"w": numbers}) == as_ints
    mars(1e-2, weight_dimension_numbers={"w": numbers}).init(params)


@pytest.mark.parametrize("axis", [True, np.bool_(True), (1, False), 1.0],
                         ids=["bool", "numpy-bool", "in-a-tuple", "float"])
def test_an_axis_neither_an_integer_nor_a_name_is_refused_naming_the_parameter(axis):
    numbers = {"kernel": MuonDimensionNumbers(reduction_axis=axis, output_axis=2)}
    with pytest.raises(TypeError, match=r"weight_dimension_numbers at \['kernel'\]: reduction_axis .* is neither"):
        mars(1e-2, weight_dimension_numbers=numbers).init({"kernel": jnp.zeros((2, 3, 4))})
