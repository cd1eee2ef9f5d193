"""Multi-slice on the local pod (compat 42, ``MarsTrainerConfig.num_slices``/``device_mesh``): processes grouped into
slices by the launcher's ``MEGASCALE_*`` environment, the mesh's DCN axes across them, as on TPU.

The proof is against the session's one-slice pod (``pod_reference``: 2 processes x 2 devices, one slice): the same
tiny run as 2 slices x 1 host x 2 devices, data parallel over DCN (``replica_dcn_axis_size: -1``), trains the same
losses, resumes from a checkpoint bitwise (``extended``), and its compiled training step crosses slices only in collectives over the
DCN axis alone, read from the step's HLO (tests of the reader: tests/test_collectives.py). The slices' layout and the
defect itself: tests/compat/test_levanter_slices.py."""

from __future__ import annotations

import pytest

from levanter_mars.bench.collectives import collectives, crossing, dcn_transfers, only_over_dcn
from tests.helpers.pod import run_pod
from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import losses, run_paths, tiny_config
from tests.helpers.xla_flags import device_flags


@pytest.mark.slow
@pytest.mark.multidevice
def test_two_slices_train_like_one_and_cross_slices_only_over_the_dcn_axis(tmp_path, pydocs_corpus, pod_reference):
    run_id = "slices-2x1x2"
    config = tiny_config(tmp_path, pydocs_corpus, run_id, {"trainer": {"replica_dcn_axis_size": -1}})
    dump = tmp_path / "hlo"
    dump_flags = f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*"

    def slice_env(i: int) -> dict[str, str]:
        env = {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": str(i)}
        return {**env, "XLA_FLAGS": f"{device_flags(2)} {dump_flags}"} if i == 0 else env

    pod = run_pod(config, log_dir=tmp_path / "logs", name=run_id, process_env=slice_env)
    assert [p.returncode for p in pod.procs] == [0, 0], pod.describe()
    mesh = "Mesh: replica 2 (DCN 2 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 2 slice(s) of 2 device(s)"
    assert mesh in pod.output(0), pod.output(0)[-3000:]

    got = losses(run_paths(tmp_path, run_id)["metrics"])
    one_slice = losses(pod_reference[2]["metrics"])
    assert got.keys() == one_slice.keys() and len(got) == 30
    worst = max(abs(got[s] - one_slice[s]) for s in got)
    print(f"2 slices x 1 host x 2 devices against 1 slice x 2 hosts x 2 devices: worst loss difference {worst:.3g}")
    assert worst <= 1e-6, worst

    (hlo,) = [p for p in dump.glob("*train_step*after_optimizations.txt")]
    found = collectives(hlo.read_text())
    slice_of = [0, 0, 1, 1]  # the mesh's devices in order: slice 0's two, then slice 1's
    across = crossing(found, slice_of)
    assert across, "no collective crosses the slices: the DCN axis is not in the program"
    assert not _dcn_or_whole_batch(across, slice_of), across
    dcn = [c for c in across if only_over_dcn(c, slice_of)]
    # The FSDP shards' gradients (the embedding's: 2 x 4096 x 16 x 4 bytes) are summed over DCN alone.
    assert max(c.bytes for c in dcn if c.op == "all-reduce") == 2 * 4096 * 16 * 4, dcn
    print(f"collectives crossing slices: {[(c.op, c.groups, c.bytes) for c in across]} of {len(found)}")


@pytest.mark.slow
@pytest.mark.extended  # two 2-slice pods; in CI: test_limping.py resumes a run bitwise, the test above trains 2 slices
def test_a_two_slice_run_resumes_bitwise_on_two_slices(tmp_path, pydocs_corpus):
    """Killed right after its step-20 checkpoint (a copy of what it left) and resumed on 2 slices: bitwise the same as
    the uninterrupted 2-slice run."""
    run_id = "slices-resume"
    config = tiny_config(tmp_path, pydocs_corpus, run_id, {"trainer": {"replica_dcn_axis_size": -1}})
    slices = lambda i: {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": str(i)}  # noqa: E731
    pod = run_pod(config, log_dir=tmp_path / "logs", name=run_id, process_env=slices)
    assert [p.returncode for p in pod.procs] == [0, 0], pod.describe()
    got = losses(run_paths(tmp_path, run_id)["metrics"])
    copy, resumed = copy_of_run(config, run_paths(tmp_path, run_id), tmp_path / "resumed", up_to_step=20)
    rerun = run_pod(copy, log_dir=tmp_path / "logs", name=f"{run_id}-resumed", process_env=slices)
    assert [p.returncode for p in rerun.procs] == [0, 0], rerun.describe()
    assert "step-20" in rerun.output(0) and "Resuming from" in rerun.output(0), rerun.output(0)[-3000:]
    again = losses(resumed["metrics"])
    assert sorted(again) == list(range(30))
    assert again == got, {s: (again[s], got[s]) for s in got if again[s] != got[s]}


def _dcn_or_whole_batch(across, slice_of):
    """Each collective that crosses slices runs over the DCN axis alone, or over every device (a reduction over the
    whole batch, replica x data, which any data-parallel layout takes across slices): never a mixture."""
    every = tuple(range(len(slice_of)))
    return [c for c in across if not (only_over_dcn(c, slice_of) or c.groups in ((), (every,)))]


@pytest.mark.slow
def test_on_the_tpu_compiler_two_v5e_slices_cross_only_over_the_dcn_axis(tmp_path, pydocs_corpus):
    """The tiny step for 2 x v5litepod-4 (libtpu's topology with ``num_slices=2``, its devices' own slice indices),
    compiled by the TPU compiler as pre-flight compiles it. XLA:TPU compiles each slice's program: its collectives join
    that slice's 4 chips only (ICI), and what crosses slices are MegaScale transfers (DCN): the gradients' sums, the
    largest the embedding's FSDP shard (4096 x 32 / 4 chips, float32)."""
    from levanter_mars.infra.preflight.step import lower_train_step
    from levanter_mars.infra.preflight.topology import abstract_devices, tpu_target
    from levanter_mars.infra.slices import slice_type
    from levanter_mars.program_config import parse_train_config

    overrides = {"trainer": {"replica_dcn_axis_size": -1}}
    config = parse_train_config(["--config_path", str(tiny_config(tmp_path, pydocs_corpus, "tpu-slices", overrides))])
    devices = abstract_devices(tpu_target(slice_type("v5litepod-4")), num_slices=2)
    step = lower_train_step(config, devices, 2, vocab_size=4096, eos_id=None)
    assert dict(step.mesh.shape) == {"replica": 2, "data": 4, "model": 1}
    assert [d.slice_index for d in step.mesh.devices[:, :, 0].ravel()] == [0] * 4 + [1] * 4
    text = step.lowered.compile().as_text()
    ici = collectives(text)
    assert ici and {g for c in ici for g in c.groups} == {(0, 1, 2, 3)}, "an ICI collective left its slice"
    dcn = dcn_transfers(text)
    assert {t.kind for t in dcn} <= {"ALL_REDUCE", "ALL_GATHER"} and dcn, dcn
    largest = max(dcn, key=lambda t: t.bytes)
    assert (largest.kind, largest.reduction, largest.bytes) == ("ALL_REDUCE", "SUM", 4096 * 32 // 4 * 4)
    print(f"2 x v5litepod-4: {len(ici)} ICI collectives; DCN: {[(t.kind, t.bytes) for t in dcn]}, "
          f"{sum(t.bytes for t in dcn)} bytes")
