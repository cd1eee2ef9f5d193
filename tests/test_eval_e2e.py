"""End to end: the eval harness during training and standalone, on the same checkpoints of tiny runs.

The in-training result at step N must equal the standalone result on the step-N checkpoint item by item (every
choice's log-likelihood, bit for bit), for a Levanter checkpoint, an exported HF checkpoint, and a run on 8
simulated devices in exact mode. The task is the held-out local multiple-choice task (tests/data/lm_eval_tasks).
"""

import json
import shutil

import pytest

from levanter_mars.training.run.metrics import read_metrics
from tests.helpers.evals import (
    EIGHT_DEVICES,
    LOCAL_TASKS,
    OFFLINE_SUITE,
    include_suite,
    item_loglikelihoods,
    run_eval_cli,
)
from tests.helpers.numpy_gpt2 import reference_results
from tests.helpers.training import REPO, describe_failure, run_cli, run_paths, run_python, tiny_config

pytestmark = pytest.mark.slow

ACC = "lm_eval/pydocs_mc/acc"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("evals")


def _train(workdir, corpus, run_id, overrides, env=None):
    config = include_suite(tiny_config(workdir, corpus, run_id, overrides))
    proc = run_cli(config, env=env)
    assert proc.returncode == 0, describe_failure(proc)
    return config, run_paths(workdir, run_id)


def _in_training(paths, step):
    return paths["run_dir"] / "eval" / "in_training" / f"step-{step}" / "results.json"


def _results(path):
    return json.loads(path.read_text())["results"]["pydocs_mc"]


@pytest.fixture(scope="module")
def approx_run(workdir, pydocs_corpus):
    """12 steps on one device, evaluated at step 10 and at the end (step 11); also exports HF checkpoints."""
    overrides = {
        "trainer": {"num_train_steps": 12},
        "eval_harness_steps": 10,
        "hf_save_path": str(workdir / "hf"),
        "hf_save_steps": 10,
    }
    return _train(workdir, pydocs_corpus, "evals", overrides)


@pytest.fixture(scope="module")
def eight_device_exact_run(workdir, pydocs_corpus):
    """10 steps of exact MARS on 8 simulated devices, evaluated and checkpointed at step 5 and at the end."""
    overrides = {
        "trainer": {"num_train_steps": 10, "checkpointer": {"keep": [{"every": 5}]}},
        "eval_harness_steps": 5,
        "optimizer": {"exact": True},
    }
    return _train(workdir, pydocs_corpus, "evals8", overrides, env=EIGHT_DEVICES)


def test_in_training_results_reach_metrics_jsonl_and_the_run_directory(approx_run):
    _, paths = approx_run
    evaluated = {r["step"]: r for r in read_metrics(paths["metrics"]) if ACC in r}
    assert sorted(evaluated) == [10, 11], "every eval_harness_steps and once at the end (not twice)"
    assert sorted(p.name for p in (paths["run_dir"] / "eval" / "in_training").iterdir()) == ["step-10", "step-11"]
    for step, record in evaluated.items():
        results = _results(_in_training(paths, step))
        assert record[ACC] == results["acc,none"] and record["lm_eval/pydocs_mc/acc_norm"] == results["acc_norm,none"]
        assert json.loads(_in_training(paths, step).read_text())["n-samples"]["pydocs_mc"]["effective"] == 48
        table = (_in_training(paths, step).parent / "results.md").read_text()
        accuracy = f"{100 * results['acc,none']:.2f}"
        assert f"| evals (step {step}) | {accuracy} | {accuracy} |" in table, table
    # Training moved the model between the two evaluations.
    assert item_loglikelihoods(_in_training(paths, 10)) != item_loglikelihoods(_in_training(paths, 11))


def test_standalone_on_the_step_checkpoint_equals_the_in_training_result(approx_run):
    config, paths = approx_run
    proc = run_eval_cli(
        "--config_path", str(OFFLINE_SUITE),
        "--checkpoint_path", str(paths["checkpoints"] / "step-10"),
        "--train_config_path", str(config),
        # The task by name, from a directory of task YAMLs (the suite file gives it as a path).
        "--task_spec", '["pydocs_mc"]',
        "--include_path", f'["{LOCAL_TASKS}"]',
    )
    assert proc.returncode == 0, describe_failure(proc)
    standalone = paths["run_dir"] / "eval" / "pydocs_offline" / "step-10" / "results.json"
    assert str(standalone) in proc.stdout and "| evals (step 10) |" in proc.stdout
    assert item_loglikelihoods(standalone) == item_loglikelihoods(_in_training(paths, 10))
    assert _results(standalone) == _results(_in_training(paths, 10))
    # Its own log, beside the training run's (issue 46: it appended to runs/<run id>.log, the training run's).
    eval_log = (paths["run_dir"].parent / "evals.eval.log").read_text()
    assert f"Evaluating {paths['checkpoints'] / 'step-10'}" in eval_log
    assert "Unknown leaf type" not in eval_log + proc.stderr  # compat defect 43: the model's None leaves
    assert f"Evaluating {paths['checkpoints']}" not in (paths["run_dir"].parent / "evals.log").read_text()


def test_standalone_on_an_exported_hf_checkpoint_needs_no_training_config(approx_run, workdir):
    _, paths = approx_run
    hf = workdir / "hf" / "evals" / "step-10"
    assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists()
    out = workdir / "hf_eval"
    proc = run_eval_cli(
        "--config_path", str(OFFLINE_SUITE), "--checkpoint_path", str(hf),
        "--per_device_eval_parallelism", "8",  # the tiny run's eval batch
        "--output_dir", str(out),
    )
    assert proc.returncode == 0, describe_failure(proc)
    assert "| evals (step 10) |" in (out / "results.md").read_text()
    assert item_loglikelihoods(out / "results.json") == item_loglikelihoods(_in_training(paths, 10))


def _assert_equals_reference(ours_json, hf_dir, task, monkeypatch):
    """Each choice's log-likelihood within 1e-3 nats of lm-eval on the numpy reference forward; equal accuracies."""
    monkeypatch.chdir(REPO)  # the task's data path is relative to the repository root
    reference = reference_results(hf_dir, task, LOCAL_TASKS)
    samples = sorted(reference["samples"][task], key=lambda s: s["doc_id"])
    expected = [[float(choice[0]) for choice in sample["filtered_resps"]] for sample in samples]
    ours = item_loglikelihoods(ours_json, task)
    assert len(ours) == len(expected) and all(len(a) == len(b) for a, b in zip(ours, expected))
    worst = max(abs(a - b) for x, y in zip(ours, expected) for a, b in zip(x, y))
    assert worst <= 1e-3, f"worst per-choice difference {worst} nats"
    ours_metrics = json.loads(ours_json.read_text())["results"][task]
    for metric in ("acc,none", "acc_norm,none"):
        assert ours_metrics[metric] == reference["results"][task][metric], metric


def test_in_training_loglikelihoods_equal_an_independent_reference_on_the_hf_export(approx_run, workdir, monkeypatch):
    _, paths = approx_run
    _assert_equals_reference(_in_training(paths, 10), workdir / "hf" / "evals" / "step-10", "pydocs_mc", monkeypatch)


def test_standalone_on_requests_longer_than_the_context_equals_an_independent_reference(
    approx_run, workdir, monkeypatch
):
    """pydocs_long: requests from a few tokens to twice seq_len, contexts ending in a space (Levanter's own harness
    fails on those: its split leaves no continuation token)."""
    config, paths = approx_run
    out = workdir / "long_eval"
    proc = run_eval_cli(
        "--config_path", str(OFFLINE_SUITE), "--checkpoint_path", str(paths["checkpoints"] / "step-10"),
        "--train_config_path", str(config), "--task_spec", '["pydocs_long"]', "--include_path", f'["{LOCAL_TASKS}"]',
        "--output_dir", str(out),
    )
    assert proc.returncode == 0, describe_failure(proc)
    _assert_equals_reference(out / "results.json", workdir / "hf" / "evals" / "step-10", "pydocs_long", monkeypatch)


@pytest.mark.multidevice
def test_eight_device_exact_run_in_training_equals_standalone_on_its_newest_checkpoint(eight_device_exact_run):
    config, paths = eight_device_exact_run
    assert sorted(r["step"] for r in read_metrics(paths["metrics"]) if ACC in r) == [5, 9]
    manifest = json.loads((paths["checkpoints"] / "step-9" / "levanter_mars_manifest.json").read_text())
    assert manifest["run_info"]["optimizer"]["exact"] is True
    torn = paths["checkpoints"] / "step-25" / "model"  # interrupted before metadata.json: must be skipped
    torn.mkdir(parents=True)
    try:
        # No checkpoint_path: the training config's run checkpoint directory, newest complete checkpoint.
        proc = run_eval_cli("--config_path", str(OFFLINE_SUITE), "--train_config_path", str(config), env=EIGHT_DEVICES)
    finally:
        shutil.rmtree(torn.parent)
    assert proc.returncode == 0, describe_failure(proc)
    standalone = paths["run_dir"] / "eval" / "pydocs_offline" / "step-9" / "results.json"
    assert json.loads(standalone.read_text())["levanter_mars"]["checkpoint"] == str(paths["checkpoints"] / "step-9")
    assert item_loglikelihoods(standalone) == item_loglikelihoods(_in_training(paths, 9))


@pytest.mark.multidevice
def test_comparison_script_tables_two_runs(approx_run, eight_device_exact_run, workdir):
    (_, approx), (_, exact) = approx_run, eight_device_exact_run
    output = workdir / "comparison.md"
    proc = run_python(
        "scripts/compare_evals.py", str(_in_training(approx, 11).parent), str(_in_training(exact, 9)),
        "--label", "MARS approx", "--label", "MARS exact (8 devices)", "--suite", str(OFFLINE_SUITE),
        "--output", str(output), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = output.read_text().splitlines()
    assert lines[0] == "| Run | PyDocs-MC | Avg. |" and len(lines) == 4
    for line, (label, paths, step) in zip(lines[2:], [("MARS approx", approx, 11), ("MARS exact (8 devices)", exact, 9)]):
        accuracy = f"{100 * _results(_in_training(paths, step))['acc,none']:.2f}"
        assert line == f"| {label} | {accuracy} | {accuracy} |"
    assert proc.stdout == output.read_text()


def test_failed_evaluations_are_logged_counted_and_training_finishes(workdir, pydocs_corpus, reference_runs):
    """Evals never kill training. From the session's reference run's step-20 checkpoint (copied, not retrained), with
    the suite every 4 steps: at step 24 the task fails while scoring, at step 28 its results cannot be written, at the
    end it succeeds. On 4cb100e the run ended at step 24 (exit 1)."""
    from levanter_mars.training.run.goodput import read_record
    from tests.helpers.faults import prelude

    run_id = "eval-failures"
    config = include_suite(tiny_config(workdir, pydocs_corpus, run_id, {"eval_harness_steps": 4}))
    paths = run_paths(workdir, run_id)
    shutil.copytree(reference_runs["approx"][2]["checkpoints"] / "step-20", paths["checkpoints"] / "step-20")
    paths["run_dir"].mkdir(parents=True)
    shutil.copy(reference_runs["approx"][2]["metrics"], paths["metrics"])
    proc = run_cli(config, prelude=prelude("install_eval_failures", scoring_fails_at_eval=1, writing_fails_at_step=28))
    assert proc.returncode == 0, describe_failure(proc)
    log = proc.stdout + proc.stderr
    assert "eval harness at step 24 failed: pydocs_mc: ValueError: injected: the task's scoring failed" in log
    assert "eval harness at step 28 failed: (results): cannot write the results" in log and "No space left" in log
    records = {r["step"]: r for r in read_metrics(paths["metrics"])}
    assert sorted(records) == list(range(30)), "every step once"
    assert [records[s].get("eval_harness/failures") for s in (24, 28, 29)] == [1, 2, 2]
    assert ACC in records[29] and ACC not in records[24]
    assert [p.name for p in (paths["run_dir"] / "eval" / "in_training").iterdir()] == ["step-29"]
    (attempt,) = read_record(paths["run_dir"] / "goodput.json")["attempts"]
    assert [(f["step"], f["task"]) for f in attempt["eval_failures"]] == [(24, "pydocs_mc"), (28, "(results)")]
    assert attempt["seconds"]["eval"] > 0 and attempt["first_step"] == 21
    assert "eval failed at step 24 (attempt 1): pydocs_mc: ValueError: injected" in proc.stdout, "the summary lists it"
