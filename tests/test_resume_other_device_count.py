"""Resume on a different slice: preemptible capacity can come back in another shape (a v4-64 as a v4-32).

A run checkpointed on one device count resumes on another with the same global batch and data order: its losses
after the resume are the uninterrupted run's to 1e-5 relative (only the order of the reductions changes). A resume
that cannot work, a batch that does not divide the new devices, is refused before anything compiles.

Each case copies the uninterrupted run's step-10 checkpoint (and its metrics log, which a resume trims) into a fresh
directory and resumes there, under the same run id, on the other device count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import describe_failure, losses, output, run_cli, run_paths, tiny_config
from tests.helpers.xla_flags import device_flags

pytestmark = pytest.mark.slow

RELATIVE = 1e-5


def devices(n: int) -> dict[str, str]:
    return {"XLA_FLAGS": device_flags(n)}


def resumable_copy(config_path: Path, paths: dict, workdir: Path) -> tuple[Path, dict]:
    """The run of ``config_path`` as it was right after its step-10 checkpoint, in ``workdir`` (its whole metrics log:
    the resume trims it)."""
    return copy_of_run(config_path, paths, workdir, up_to_step=10, metrics_up_to=29)


def assert_resumed_like(reference_metrics: Path, resumed, new_paths: dict) -> None:
    assert resumed.returncode == 0, describe_failure(resumed)
    assert "step-10" in output(resumed) and "Resuming from" in output(resumed), output(resumed)[-3000:]
    reference, got = losses(reference_metrics), losses(new_paths["metrics"])
    assert sorted(got) == sorted(reference) == list(range(30))
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in range(10, 30))
    print(f"resumed on another device count: worst relative loss difference over steps 10-29: {worst:.2e}")
    assert worst <= RELATIVE, {s: (got[s], reference[s]) for s in range(10, 30)}


@pytest.fixture(scope="module")
def four_device_run(tmp_path_factory, pydocs_corpus):
    workdir = tmp_path_factory.mktemp("four-devices")
    config = tiny_config(workdir, pydocs_corpus, "reshape-1x4")
    proc = run_cli(config, env=devices(4))
    assert proc.returncode == 0, describe_failure(proc)
    return config, run_paths(workdir, "reshape-1x4")


def test_one_process_four_devices_resumes_on_two(four_device_run, tmp_path):
    config, paths = four_device_run
    copy, new = resumable_copy(config, paths, tmp_path)
    resumed = run_cli(copy, env=devices(2))
    assert_resumed_like(paths["metrics"], resumed, new)


def test_two_processes_of_two_devices_resume_as_one_process_of_four(pod_reference, tmp_path):
    config, _pod, paths = pod_reference
    copy, new = resumable_copy(config, paths, tmp_path)
    resumed = run_cli(copy, env=devices(4))
    assert_resumed_like(paths["metrics"], resumed, new)


def test_a_resume_whose_batch_does_not_divide_the_devices_is_refused_before_compiling(four_device_run, tmp_path):
    config, paths = four_device_run
    copy, _ = resumable_copy(config, paths, tmp_path)
    refused = run_cli(copy, env=devices(3))  # the global batch is 8
    assert refused.returncode == 2, describe_failure(refused)
    assert "trainer.train_batch_size=8 is not divisible by the data-parallel size 3" in refused.stderr
    assert "Traceback" not in refused.stderr
