"""Pre-flight's verdict says one thing: every program is judged against the HBM the compiler lets it use, a fit's
headroom is that usable HBM less its total, and a refusal's JSON has no positive headroom. Built from compiler figures
(``Compiled``) without compiling, but for the probe of the usable HBM, which asks the TPU compiler (libtpu)."""

from __future__ import annotations

import json

import pytest

from levanter_mars.infra.preflight import capacity
from levanter_mars.infra.preflight.capacity import UsableHbm, probe, usable_hbm
from levanter_mars.infra.preflight.report import Verdict
from levanter_mars.infra.preflight.step import ONE_BUFFER, TEMPORARIES, WHOLE_PROGRAM, Compiled, out_of_memory
from levanter_mars.infra.preflight.topology import GiB, tpu_target
from levanter_mars.infra.slices import slice_type
from tests.helpers import preflight
from tests.helpers.preflight import REPO, require_tpu_compiler

V4_8 = tpu_target(slice_type("v4-8"))
#: What libtpu 0.0.37 and 0.0.42.1 state a v4 chip's program may use (their out-of-memory verdicts).
V4_USABLE = int(30.75 * GiB)
#: The ways the compilers refuse the one-layer case of tests/test_preflight.py: the whole program (libtpu 0.0.37),
#: its temporaries alone (0.0.42.1), one buffer alone (0.0.37 too: the logits, stating the physical 32 GiB).
WHOLE = "RESOURCE_EXHAUSTED: Used 49.09G of 30.75G hbm."
PART = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (56.39G) "
        "exceeds available HBM (30.75G).")
BUFFER = ("RESOURCE_EXHAUSTED: Allocation (size=52705624064) would exceed memory (size=34359738368) :: "
          "#allocation1061 [shape = 'bf16[512,1024,50257]{1,2,0:T(8,128)(2,1)}', space=hbm]")


def _compiled(arguments: float, temporaries: float) -> Compiled:
    """A program the compiler placed, figures in GiB (outputs donated into the arguments)."""
    return Compiled(int(arguments * GiB), int(arguments * GiB), int(arguments * GiB), int(temporaries * GiB),
                    flops=None, compile_seconds=1.0)


def _refused(message: str) -> Compiled:
    verdict = out_of_memory(message)
    return Compiled(None, None, None, None, None, 1.0, out_of_memory=verdict.line, used_bytes=verdict.needed,
                    used_counts=verdict.counts, capacity_bytes=verdict.capacity)


#: What the probe gets on v4 (test_the_compiler_states_the_usable_hbm_when_probed), without compiling it here.
PROBED = UsableHbm(V4_USABLE, "the TPU compiler's refusal of a probe")


@pytest.fixture(autouse=True)
def _probe_without_compiling(monkeypatch):
    monkeypatch.setattr(capacity, "probe", lambda devices, nominal_bytes: PROBED)


def _verdict(compiled: Compiled, evals: dict | None = None) -> Verdict:
    """On v4-8, 1 GiB of optimizer state per chip, judged against the usable HBM pre-flight finds."""
    usable = usable_hbm(compiled, devices=[], nominal_bytes=V4_8.hbm_bytes_per_chip)
    return Verdict("config/x.yaml", V4_8, 1, parameters=int(0.5 * GiB), optimizer_state=GiB, compiled=compiled,
                   usable=usable, per_device_parallelism=8, train_batch_size=32, data_axis_size=4,
                   gradient_checkpointing=False, eval_steps=evals or {}, per_device_eval_parallelism=16)


def test_a_fits_headroom_is_the_usable_hbm_less_its_total():
    report = _verdict(_compiled(arguments=2.0, temporaries=20.0)).to_json()
    assert report["per_chip"]["total"] == int(2.0 * GiB) + int(20.0 * GiB)
    assert report["hbm_bytes_per_chip"] == 32 * GiB and report["usable_hbm_bytes_per_chip"] == V4_USABLE
    assert report["headroom_bytes"] == V4_USABLE - report["per_chip"]["total"]
    assert report["fits"] is True


def test_a_program_between_the_usable_and_the_nominal_hbm_does_not_fit():
    """31 GiB: under the nominal 32, over the 30.75 the compiler lets a program use (it would run out on the pod)."""
    train = _verdict(_compiled(arguments=2.0, temporaries=29.0))
    assert not train.fits and train.to_json()["headroom_bytes"] < 0
    # An eval program of 30 GiB with 1 GiB of resident optimizer state, beside a train step that fits.
    with_eval = _verdict(_compiled(arguments=2.0, temporaries=20.0), {"eval_loss": _compiled(2.0, 28.0)})
    report = with_eval.to_json()
    assert report["eval"]["eval_loss"]["total"] == int(31 * GiB)
    assert report["eval"]["eval_loss"]["fits"] is False and report["fits"] is False
    said = with_eval.refusal()
    assert "eval_loss (between train steps): it needs 31.00 GiB with the resident optimizer state" in said
    assert "of 30.75 GiB usable (32 GiB HBM)" in said and "trainer.per_device_eval_parallelism (now 16" in said


@pytest.mark.parametrize("message", [WHOLE, PART, BUFFER], ids=["whole-program", "temporaries-alone", "one-buffer"])
def test_a_refusal_shows_no_positive_headroom_and_keeps_a_partial_figure_apart(message):
    verdict = _verdict(_refused(message))
    report = verdict.to_json()
    assert report["fits"] is False
    assert report["usable_hbm_bytes_per_chip"] == V4_USABLE
    if message == BUFFER:  # its "memory (size=...)" is the physical 32 GiB: the probe says what a program may use
        assert report["usable_hbm_source"] == PROBED.source
    else:  # the refused program's own statement
        assert "this program" in report["usable_hbm_source"] and report["out_of_memory"] in report["usable_hbm_source"]
    per_chip = report["per_chip"]
    assert per_chip["arguments"] is None and per_chip["temporaries"] is None  # no memory analysis of a refusal
    if message == WHOLE:
        assert per_chip["total"] == int(49.09 * GiB) and "partial" not in per_chip
        assert report["headroom_bytes"] == V4_USABLE - per_chip["total"] < 0
        assert "it needs 49.09 GiB per chip" in verdict.refusal()
    elif message == PART:
        assert per_chip["total"] is None and report["headroom_bytes"] is None
        assert per_chip["partial"] == {"bytes": int(56.39 * GiB), "counts": TEMPORARIES}
        assert "its temporaries alone need 56.39 GiB (the compiler's figure) per chip" in verdict.refusal()
    else:
        assert per_chip["total"] is None and report["headroom_bytes"] is None
        assert per_chip["partial"] == {"bytes": 52705624064, "counts": ONE_BUFFER}
        said = verdict.refusal()
        assert "one buffer alone needs 49.09 GiB (the compiler's figure) per chip, of 30.75 GiB usable" in said


def test_a_refusal_names_every_failing_program_with_its_own_figure():
    """Figures that count different things (a whole eval program, the harness's temporaries alone) are each
    reported, not ranked against each other."""
    verdict = _verdict(_compiled(2.0, 20.0), {"eval_loss": _compiled(2.0, 28.0), "eval_harness": _refused(PART)})
    said = verdict.refusal()
    assert "eval_loss (between train steps): it needs 31.00 GiB" in said
    assert "eval_harness (between train steps): its temporaries alone need 56.39 GiB" in said
    assert "eval_harness.max_length" in said
    harness = verdict.to_json()["eval"]["eval_harness"]
    assert harness["total"] is None and harness["partial"]["counts"] == TEMPORARIES and harness["fits"] is False
    assert WHOLE_PROGRAM not in said


@pytest.mark.parametrize("tpu_type,usable_gib", [("v4-8", 30.75), ("v5litepod-4", 15.75)])
def test_the_compiler_states_the_usable_hbm_when_probed(tpu_type, usable_gib):
    """The probe's refusal states what the compiler's refusals of real programs state (the messages above); a
    compiler that stated nothing would give the documented fallback instead, which this tells apart."""
    require_tpu_compiler()
    from levanter_mars.infra.preflight.topology import abstract_devices

    target = tpu_target(slice_type(tpu_type))
    usable = probe(abstract_devices(target), target.hbm_bytes_per_chip)
    assert usable.bytes == int(usable_gib * GiB), usable
    assert usable.source.startswith("the TPU compiler's refusal of a probe"), usable


def test_without_the_tpu_compiler_its_tests_fail_unless_a_variable_says_skip(monkeypatch):
    """``make setup`` installs libtpu: a setup without it fails the tests that need it, not skip them silently."""
    real = preflight.importlib.util.find_spec
    without_libtpu = lambda name, *rest: None if name == "libtpu" else real(name, *rest)  # noqa: E731
    monkeypatch.setattr(preflight.importlib.util, "find_spec", without_libtpu)
    monkeypatch.delenv(preflight.NO_TPU_COMPILER_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match="the TPU compiler is not installed"):
        require_tpu_compiler()
    monkeypatch.setenv(preflight.NO_TPU_COMPILER_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match=f"{preflight.NO_TPU_COMPILER_ENV}=1 allows that"):
        require_tpu_compiler()


def test_every_pods_record_is_judged_against_its_usable_hbm():
    """docs/pods/*.json (scripts/size_pods.py): each says one thing."""
    records = sorted((REPO / "docs" / "pods").glob("*.json"))
    assert records
    for path in records:
        r = json.loads(path.read_text())
        usable, total = r["usable_hbm_bytes_per_chip"], r["per_chip"]["total"]
        assert 0 < usable <= r["hbm_bytes_per_chip"] and r["usable_hbm_source"], path.name
        if total is None:
            assert r["headroom_bytes"] is None and "partial" in r["per_chip"] and r["fits"] is False, path.name
        else:
            assert r["headroom_bytes"] == usable - total, path.name
        evals = [e for e in r["eval"].values() if isinstance(e, dict)]
        for e in evals:
            assert e["fits"] == (e["out_of_memory"] is None and e["total"] is not None and e["total"] <= usable)
        train_fits = r["out_of_memory"] is None and total is not None and total <= usable
        assert r["fits"] == (train_fits and all(e["fits"] for e in evals)), path.name
