"""The tiny config as a local pod: 2 training processes x 2 simulated devices, joined by jax.distributed, through the
CLI with Levanter's own ``--trainer.distributed.*`` flags, sharing one checkpoint directory as a pod shares a bucket.

The numerical reference is the session's 1-process runs (``reference_runs``). Runs are shared between tests (each
costs a minute or two on 2 cores); the approx pod run is the session's ``pod_reference``, the fault reference of the
pods with a killed host: on gs:// (tests/test_gcs.py, with a torn checkpoint) and through the Ray launcher on local
disk (tests/test_infra_local_ray.py).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.evals import LOCAL_TASKS, OFFLINE_SUITE, item_loglikelihoods, run_eval_cli
from tests.helpers.pod import run_pod
from tests.helpers.training import describe_failure, losses, run_paths, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.multidevice]

@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("pod")


def _pod_config(workdir, corpus, run_id, overrides=None):
    return tiny_config(workdir, corpus, run_id, overrides)


def _completed_pod(config, workdir, name, **kwargs):
    pod = run_pod(config, log_dir=workdir / "logs", name=name, **kwargs)
    assert [p.returncode for p in pod.procs] == [0, 0], pod.describe()
    return pod


@pytest.fixture(scope="module")
def pod_runs(workdir, pydocs_corpus, pod_reference):
    """Uninterrupted pod runs: approx (the session's ``pod_reference``, with the offline eval suite at the end) and
    exact."""
    config = _pod_config(workdir, pydocs_corpus, "pod-exact", {"optimizer": {"exact": True}})
    pod = _completed_pod(config, workdir, "pod-exact")
    exact = (config, pod, run_paths(workdir, "pod-exact"))
    return {"approx": pod_reference, "exact": exact}


def _steps(metrics_path):
    lines = metrics_path.read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]  # every line parses


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_two_processes_train_like_one(pod_runs, reference_runs, mode):
    _, pod, paths = pod_runs[mode]
    got, reference = losses(paths["metrics"]), losses(reference_runs[mode][2]["metrics"])
    assert got.keys() == reference.keys() and len(got) == 30
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in reference)
    assert worst <= 1e-5, worst
    # One writer: each step once in metrics.jsonl, though both processes logged it.
    assert _steps(paths["metrics"]) == list(range(30))
    assert "Run pod-" in pod.output(0) and "Run pod-" not in pod.output(1)
    # Programs loaded from a persistent cache have deadlocked XLA:CPU pods (docs/reliability.md): every host compiles.
    for i in range(2):
        assert "Compilation cache: off on this XLA:CPU pod" in pod.output(i), pod.output(i)[-3000:]


def test_in_training_eval_on_two_processes_equals_a_one_process_eval_of_the_same_weights(pod_runs):
    config, _, paths = pod_runs["approx"]
    in_training = paths["run_dir"] / "eval" / "in_training" / "step-29" / "results.json"
    assert in_training.exists()
    proc = run_eval_cli(
        "--config_path", str(OFFLINE_SUITE), "--checkpoint_path", str(paths["checkpoints"] / "step-29"),
        "--train_config_path", str(config), "--task_spec", '["pydocs_mc"]', "--include_path", f'["{LOCAL_TASKS}"]',
    )
    assert proc.returncode == 0, describe_failure(proc)
    standalone = paths["run_dir"] / "eval" / "pydocs_offline" / "step-29" / "results.json"
    pod_items, single_items = item_loglikelihoods(in_training), item_loglikelihoods(standalone)
    assert len(pod_items) == 48
    worst = max(abs(a - b) for pa, pb in zip(pod_items, single_items) for a, b in zip(pa, pb))
    assert worst < 1e-4, worst
    pod_result = json.loads(in_training.read_text())["results"]["pydocs_mc"]
    single_result = json.loads(standalone.read_text())["results"]["pydocs_mc"]
    assert pod_result["acc,none"] == single_result["acc,none"]
    assert pod_result["acc_norm,none"] == single_result["acc_norm,none"]


def test_a_complete_pod_run_says_so(pod_runs, workdir):
    """A finished pod run started again: both processes say it is complete and train nothing. (``fresh=true`` on 2
    processes, the old run set aside once, is held by the Ray launcher's pod test: tests/test_infra_local_ray.py.)"""
    config, _, paths = pod_runs["exact"]
    again = _completed_pod(config, workdir, "pod-exact-again")
    for i in range(2):
        assert "already complete" in again.output(i)
    assert _steps(paths["metrics"]) == list(range(30))
