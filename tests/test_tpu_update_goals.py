"""The update's cost goals on the TPU compiler, held on every commit and on every lock move (issue 30).

The update is compiled by XLA:TPU ahead of time (libtpu, no TPU needed: ``levanter_mars.bench.tpu_compile``) for one
v5e chip, on a reduced GPT-2: GPT-2 small's widths and vocabulary with 2 layers and biases (``small-reduced``), so that
its 16 compiles take about two and a half minutes. Both honest constructions of the program are held (the gradient
donated with the state, and the gradient its own input), with AdamW built the same way in the same run, inside the
non-finite guard every trainer wraps the optimizer in (the update training runs) and without it:

* the update training runs: MARS-AdamW approx bytes accessed <= 1.55 x AdamW's (fp32 buffers), <= 1.25 x (bf16);
* the optimizer alone: MARS-AdamW approx's own operations move over AdamW's the passes it must make (fp32: 3; bf16:
  0.5), to within :data:`OWN_TOLERANCE` either way (more is traffic the update should not make, less a pass it skipped,
  e.g. a correction that no longer reads the previous gradient), its bytes accessed at most 1.5 passes more than that,
  and no donated buffer is copied aside;
* MARS-M approx alone moves over Muon's at most what its previous gradient needs: the correction's norm and the
  momentum read it and the step writes it, 3 passes over the tensors that carry one (the matrices: 0.26 of the
  reduced model's parameter bytes, 0.68 of GPT-2 small's), in what its own operations move and in what crosses HBM
  (``bench.hlo``). Its bytes accessed, which add XLA:TPU's staging between memory spaces, are reported in
  docs/benchmarks.md and not held: on GPT-2 small they exceed Muon's + 3 by the staging alone.

docs/benchmarks.md has the same figures on the whole GPT-2 small (``scripts/bench_optimizer.py --sizes small --tpu
v5e --no-timing``), with MARS-M against Muon. The TPU compiler is part of the test setup (``make setup`` installs the
``tpu`` extra): without it this fails, saying so, rather than skip (unless LEVANTER_MARS_TEST_NO_TPU_COMPILER=1).
"""

from __future__ import annotations

import functools

import pytest

from tests.helpers.preflight import require_tpu_compiler

OPTIMIZERS = ["adamw", "mars-adamw-approx-fp32", "mars-adamw-approx-bf16"]
RATIO_GOALS = {"mars-adamw-approx-fp32": 1.55, "mars-adamw-approx-bf16": 1.25}
#: What MARS-AdamW approx's update moves beyond AdamW's in its own traffic (fp32 parameter passes, staging left out).
#: fp32 buffers: the previous gradient, read by the correction's norm (in the pass that reads g for the clip's norm,
#: which AdamW has too) and read and written by the update (3). bf16 buffers: those 3 in half the bytes (1.5), less the
#: half pass saved on each of the first moment's read and write (0.5). GPT-2 small measures 10.9995 and 8.4998 against
#: AdamW's 8.0000 (docs/benchmarks/optimizer_tpu_v5e_small_lock.json: 3 and 0.5 less 0.0005 and 0.0002 of a pass).
OWN_OVER_ADAMW = {"mars-adamw-approx-fp32": 3.0, "mars-adamw-approx-bf16": 0.5}
#: How far from its ideal MARS-AdamW's own traffic over AdamW's may be, in passes, either way.
OWN_TOLERANCE = 0.01
#: What bytes accessed (which add XLA:TPU's staging between memory spaces) may add on top, on the reduced model: it
#: measures -2.08 (fp32) and +0.63 (bf16) passes. Not a bound GPT-2 small meets alone with the gradient its own input
#: (+1.80 and +1.94 there, reported in docs/benchmarks.md). The code of 1def919 made 16.10 and 13.65 passes against
#: AdamW's 8.71 on GPT-2 small (+7.39, +4.94). On the reduced model it bounds the staging a compiler may add: the
#: correction's norm in its plain form (+3.58 fp32 passes over AdamW's, within 4.5) is caught by the own-traffic bound.
BYTES_ACCESSED_SLACK = 1.5
CONSTRUCTIONS = ["donated", "own-gradient"]
MARS_M, MUON = "mars-m-approx-fp32", "muon-fp32"
#: Passes over the previous gradient: read by the correction's norm and by the momentum, and written.
PREVIOUS_GRADIENT_PASSES = 3


@functools.cache
def _params():
    from levanter_mars.bench import models, tpu_compile

    return tpu_compile.abstract_gpt2_parameters(models.SIZES["small-reduced"])


def _compile(names: list[str], **options):
    """``({optimizer: row}, target)``: the cases ``names`` compiled for one v5e chip, both constructions."""
    require_tpu_compiler()
    from levanter_mars.bench import optimizers as opt
    from levanter_mars.bench import tpu_compile

    targets = tpu_compile.select_targets("v5e")
    rows = tpu_compile.compare(opt.select(",".join(names), []), _params(), lambda p, grads: (grads, None), targets,
                               tpu_compile.select_constructions(",".join(CONSTRUCTIONS)), progress=print, **options)
    return rows, targets[0]


@pytest.fixture(scope="module")
def compiled():
    """MARS-AdamW and AdamW: one compile per optimizer, construction, with and without the guard."""
    return _compile(OPTIMIZERS, unguarded=True)


@pytest.fixture(scope="module")
def compiled_mars_m():
    """MARS-M approx and Muon without the guard, and the previous gradient's bytes in float32 parameter passes."""
    import math

    import jax

    from levanter_mars.bench import models
    from levanter_mars.bench import optimizers as opt
    from levanter_mars.optim.mars_family import ScaleByMarsState

    rows, target = _compile([MARS_M, MUON], guarded=False, baseline=MUON)
    state = jax.eval_shape(opt.select(MARS_M, [])[0].build().init, _params())
    (mars,) = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ScaleByMarsState))
               if isinstance(s, ScaleByMarsState)]
    nbytes = lambda tree: sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    return rows, target, nbytes(mars.prev) / (4 * models.parameter_count(_params()))


def _figures(compiled, construction: str, figure: str, guarded: bool) -> dict[str, float]:
    from levanter_mars.bench.tpu_compile import CONSTRUCTIONS as BUILT
    from levanter_mars.bench.tpu_compile import key

    rows, target = compiled
    return {name: rows[name][key(target, BUILT[construction], figure, guarded)] for name in OPTIMIZERS}


@pytest.mark.slow
@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_the_guarded_mars_update_meets_its_ratio_goals_on_v5e(compiled, construction):
    passes = _figures(compiled, construction, "passes", guarded=True)
    for name, limit in RATIO_GOALS.items():
        assert passes[name] <= limit * passes["adamw"], (name, limit, passes)


@pytest.mark.slow
@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_mars_adamw_alone_moves_its_ideal_over_adamw(compiled, construction):
    own = _figures(compiled, construction, "own_passes", guarded=False)
    passes = _figures(compiled, construction, "passes", guarded=False)
    for name, ideal in OWN_OVER_ADAMW.items():
        assert abs(own[name] - own["adamw"] - ideal) <= OWN_TOLERANCE, (name, ideal, own)
        assert passes[name] <= passes["adamw"] + ideal + BYTES_ACCESSED_SLACK, (name, passes)
    copies = _figures(compiled, construction, "copy_mib", guarded=False)
    assert all(mib == 0 for mib in copies.values()), copies


@pytest.mark.slow
@pytest.mark.parametrize("construction", CONSTRUCTIONS)
@pytest.mark.parametrize("figure", ["own_passes", "hbm_passes"])
def test_mars_m_alone_moves_at_most_its_previous_gradient_over_muon(compiled_mars_m, construction, figure):
    from levanter_mars.bench.tpu_compile import CONSTRUCTIONS as BUILT
    from levanter_mars.bench.tpu_compile import key

    rows, target, previous_gradient = compiled_mars_m
    assert 0.2 < previous_gradient < 0.3, previous_gradient  # the 2 layers' matrices, of the reduced model
    field = key(target, BUILT[construction], figure, False)
    over_muon = rows[MARS_M][field] - rows[MUON][field]
    assert over_muon <= PREVIOUS_GRADIENT_PASSES * previous_gradient, (figure, over_muon, previous_gradient, rows)


#: The non-finite guard's own cost (issue 47): at most this many passes over the gradients on top of the optimizer
#: alone. The guard decides from the inputs (the gradients' global norm, which AdamW's clip computes anyway) and keeps
#: every written value finite by a select inside the pass that writes it; GPT-2 small measures 0.00 (AdamW), -0.74 /
#: -0.40 (MARS-AdamW fp32, by construction), 0.00 (bf16 buffers) on v5e. The guard it replaced cost 11.70 and 16.71.
GUARD_PASSES = 1.5


@pytest.mark.slow
@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_the_non_finite_guard_costs_at_most_a_pass_and_a_half(compiled, construction):
    guard = _figures(compiled, construction, "guard_passes", guarded=True)
    assert all(cost <= GUARD_PASSES for cost in guard.values()), guard
