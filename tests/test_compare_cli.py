"""A nano comparison through the CLI, as a user runs it (``python -m levanter_mars.main.compare``): AdamW against
MARS-AdamW, 2 grid points each tuned on seed 0, the best ones on final seeds 1 and 2, a few steps, one of MARS-AdamW's
points diverging.

One comparison serves every test here: it is stopped with SIGTERM (a closed ssh session) once its first run has
ended, then the same command finishes it, and copies of it are finished again: one with a run removed, on the local
pod; others with a final run recorded as diverged. Held: the stop leaves no run behind and exits 143; no completed run
is trained again and each step of each run is in its metrics once; the diverged point is recorded as such and
loses; the figures in ``compare.json`` are the definitions applied to the runs' own curves (intervals against scipy);
a final run that diverged is named and exits 3; the run trained on the local pod has the same losses as the one
trained alone.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from scipy import stats

from tests.helpers.compare_reference import seed_speedups
from levanter_mars.training.data.pydocs_corpus import config_section
from levanter_mars.training.run.metrics import read_metrics
from levanter_mars.training.run.record_copy import RECORD_DIR
from levanter_mars.training.yaml_sections import deep_merge
from tests.helpers.processes import REPO, _env
from tests.helpers.training import POLL_S, TINY_CONFIG

pytestmark = pytest.mark.slow

STEPS = 12
DIVERGING = 1e30  # learning rate: the parameters overflow within a few steps, the run stops with exit 3


def compare_command(spec: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "levanter_mars.main.compare", "--config_path", str(spec), *extra]


def run_compare(spec: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(compare_command(spec, *extra), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def started(output: str) -> list[str]:
    return [line.split()[1] for line in output.splitlines() if line.startswith("starting ")]


@pytest.fixture(scope="module")
def nano(tmp_path_factory, pydocs_corpus):
    """The shipped nano spec on the session's corpus, a few steps, with a diverging point; stopped after its first
    run, then finished. Returns (spec path, output dir, first stderr, second CompletedProcess)."""
    work = tmp_path_factory.mktemp("compare")
    base = deep_merge(yaml.safe_load(TINY_CONFIG.read_text()), config_section(pydocs_corpus))
    (work / "base.yaml").write_text(yaml.safe_dump(base))
    spec = yaml.safe_load((REPO / "config" / "compare" / "nano.yaml").read_text())
    assert "nano" in spec["name"]
    spec.update(base="base.yaml", output_dir=str(work / "out"))
    spec["base_overrides"] = deep_merge(spec["base_overrides"], {"trainer": {
        "num_train_steps": STEPS, "steps_per_eval": 4, "nonfinite": "stop"}})  # fmt: skip
    spec["arms"][1]["grid"]["learning_rate"] = [spec["arms"][1]["grid"]["learning_rate"][1], DIVERGING]
    path = work / "nano.yaml"
    path.write_text(yaml.safe_dump(spec))

    first = subprocess.Popen(compare_command(path), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    records = work / "out" / "records"
    deadline = time.monotonic() + 600
    while not (records.exists() and any(records.glob("*.json"))):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(POLL_S)
    first.send_signal(signal.SIGTERM)  # a closed ssh session sends SIGHUP; a scheduler, SIGTERM
    _, first_err = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, first_err
    left = subprocess.run(["pgrep", "-f", str(work / "out")], capture_output=True, text=True).stdout.split()
    assert not left, f"runs left training after the comparison stopped: {left}"
    interrupted = {p.stem: p.read_text() for p in records.glob("*.json")}
    second = run_compare(path)
    return path, work / "out", first_err, interrupted, second


def test_a_stopped_comparison_finishes_without_training_a_run_twice(nano):
    spec, out, first_err, interrupted, second = nano
    assert second.returncode == 0, second.stderr[-5000:]
    assert "stopped by SIGTERM: the runs were stopped" in first_err
    # What had ended before Ctrl-C is read back, its record untouched; nothing else was complete then.
    again = set(started(second.stderr))
    assert interrupted and not again & set(interrupted), (interrupted.keys(), again)
    for rid, text in interrupted.items():
        assert (out / "records" / f"{rid}.json").read_text() == text
    summary = json.loads((out / "compare.json").read_text())
    assert summary["complete"] and len(summary["runs"]) == 8  # 2 arms x 2 points on seed 0, 2 best x seeds 1, 2
    assert summary["tuning_seeds"] == [0] and summary["final_seeds"] == [1, 2]
    assert {r["seed"] for r in summary["runs"] if r["kind"] == "final"} == {1, 2}
    for run in summary["runs"]:
        metrics = read_metrics(out / "runs" / run["run_id"] / "metrics.jsonl")
        steps = [r["step"] for r in metrics]
        if run["status"] == "ok":
            assert steps == list(range(STEPS)), (run["run_id"], steps)  # each step once, resumed or not
            copied = out / "checkpoints" / run["run_id"] / RECORD_DIR / "metrics.jsonl"
            assert copied.read_text() == (out / "runs" / run["run_id"] / "metrics.jsonl").read_text()
        else:
            assert len(steps) == len(set(steps)), (run["run_id"], steps)


def test_a_diverged_point_is_recorded_loses_and_the_comparison_goes_on(nano):
    _, out, _, _, _ = nano
    summary = json.loads((out / "compare.json").read_text())
    mars = summary["arms"]["mars-adamw"]
    diverged = [r for r in summary["runs"] if r["point"] == {"learning_rate": DIVERGING}]
    assert [(r["status"], r["exit_code"]) for r in diverged] == [("diverged", 3)]
    assert mars["diverged_points"] == ["lr1e_30"] and mars["best_point"] == {"learning_rate": 1e-2}
    # Two points per arm: whichever is best is at an edge of its grid, and every output says so.
    for name, arm in summary["arms"].items():
        assert arm["edge"] == {"learning_rate": "high" if arm["best_point"]["learning_rate"] == max(
            p["point"]["learning_rate"] for p in arm["points"]) else "low"}, name
    table = (out / "compare.md").read_text()
    assert "best at grid edge: learning_rate" in table and "diverged in tuning: lr1e_30" in table
    assert (out / "compare.png").stat().st_size > 20_000


def test_the_figures_are_the_definitions_applied_to_the_runs(nano):
    """Every figure from the final seeds alone, held to a plain re-implementation and to scipy's t distribution."""
    _, out, _, _, _ = nano
    summary = json.loads((out / "compare.json").read_text())
    runs = {(r["arm"], json.dumps(r["point"]), r["seed"]): r for r in summary["runs"]}

    def best_runs(arm):
        point = json.dumps(summary["arms"][arm]["best_point"])
        return [runs[(arm, point, s)] for s in summary["final_seeds"]]

    baseline, mars = best_runs("adamw"), best_runs("mars-adamw")
    finals = [r["eval_losses"][-1] for r in baseline]
    assert summary["target_val_loss"] == pytest.approx(statistics.fmean(finals))
    assert summary["budget"]["tokens_per_run"] == STEPS * 8 * 64 == baseline[0]["eval_tokens"][-1]
    assert summary["budget"]["parameters"] > 0
    entry = summary["arms"]["mars-adamw"]
    differences = [m["eval_losses"][-1] - b["eval_losses"][-1] for m, b in zip(mars, baseline)]
    assert entry["final_val_loss_differences"] == pytest.approx(differences)
    assert entry["final_val_loss_difference"] == pytest.approx(statistics.fmean(differences))
    low, high = stats.t.interval(0.95, len(differences) - 1, loc=statistics.fmean(differences),
                                 scale=stats.sem(differences))  # fmt: skip
    assert entry["final_val_loss_difference_interval"] == pytest.approx([low, high])
    assert entry["final_val_loss_difference_interval_method"].startswith("paired Student t")
    assert entry["resolvable_difference"] == pytest.approx((high - low) / 2)
    speedups = seed_speedups([(b["eval_tokens"], b["eval_losses"]) for b in baseline],
                             [(m["eval_tokens"], m["eval_losses"]) for m in mars])  # fmt: skip
    assert entry["speedups"] == pytest.approx(speedups) if None not in speedups else entry["speedups"] == speedups
    if None not in speedups:
        assert entry["speedup"] == pytest.approx(math.exp(statistics.fmean(math.log(x) for x in speedups)))
    else:
        assert entry["speedup"] is None and "never reach the target" in entry["speedup_interval_method"]
    assert summary["arms"]["adamw"]["speedup"] == pytest.approx(1.0)
    assert all(summary["arms"][a]["seconds_per_token"] > 0 for a in ("adamw", "mars-adamw"))
    assert summary["versions"]["jax"] and summary["command"].startswith("python -m levanter_mars.main.compare")
    table = (out / "compare.md").read_text()
    assert "95% Student t over the 2 final seeds" in table and "95% CI" not in table


def _with_final_run_diverged(out: Path, copy: Path, arm: str) -> str:
    """A copy of the comparison whose ``arm``'s first final run is recorded as a diverged run (exit 3)."""
    shutil.copytree(out, copy)
    summary = json.loads((out / "compare.json").read_text())
    rid = next(r["run_id"] for r in summary["runs"] if r["arm"] == arm and r["kind"] == "final")
    path = copy / "records" / f"{rid}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "diverged", "exit_code": 3}))
    return rid


def test_a_final_run_that_diverged_is_named_and_exits_3_unless_allowed(nano, tmp_path):
    spec, out, _, _, _ = nano
    rid = _with_final_run_diverged(out, tmp_path / "out", "mars-adamw")
    proc = run_compare(spec, "--output_dir", str(tmp_path / "out"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert not started(proc.stderr)  # nothing trained again: the run ended, diverged
    assert f"error: diverged, so without figures: {rid}" in proc.stderr
    summary = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert summary["problems"] == [{"kind": "final_run_diverged", "arm": "mars-adamw", "run": rid}]
    assert "speedup" not in summary["arms"]["mars-adamw"]
    assert f"**diverged on a final seed**: {rid}" in (tmp_path / "out" / "compare.md").read_text()
    allowed = run_compare(spec, "--output_dir", str(tmp_path / "out"), "--final_runs_may_diverge", "true")
    assert allowed.returncode == 0 and f"note: diverged, so without figures: {rid}" in allowed.stderr


def test_the_baseline_diverging_is_an_error_naming_it(nano, tmp_path):
    spec, out, _, _, _ = nano
    rid = _with_final_run_diverged(out, tmp_path / "out", "adamw")
    proc = run_compare(spec, "--output_dir", str(tmp_path / "out"), "--final_runs_may_diverge", "true")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert f"error: the baseline (adamw) diverged ({rid}): there is no target" in proc.stderr


def _copy_without_run(out, tmp_path, arm: str, seed: int):
    """A copy of the finished comparison ``out`` with the final run of ``arm`` on ``seed`` removed (record, run
    directory, checkpoints): the comparison still needs it. Returns the copy and the run's id."""
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    summary = json.loads((out / "compare.json").read_text())
    rid = next(r["run_id"] for r in summary["runs"] if r["seed"] == seed and r["arm"] == arm)
    (copy / "records" / f"{rid}.json").unlink()
    shutil.rmtree(copy / "runs" / rid)
    shutil.rmtree(copy / "checkpoints" / rid)
    return copy, rid


@pytest.mark.extended  # CI budget: a Ray pod and the eval suite; in CI the runs train as plain processes
def test_a_missing_run_is_trained_on_the_local_pod_with_the_same_losses(nano, tmp_path):
    """The same comparison with one completed run removed, finished through the launcher on a one-host local pod:
    only that run is trained, and its losses are bitwise those of the run trained as a plain process. Then the eval
    suite runs on each arm's best point, every seed, in one table of seed means."""
    spec, out, _, _, _ = nano
    copy, removed = _copy_without_run(out, tmp_path, "mars-adamw", 1)
    suite = REPO / "config" / "eval" / "pydocs_offline.yaml"
    proc = run_compare(spec, "--output_dir", str(copy), "--tpu_type", "cpu", "--eval_suite", str(suite))
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert started(proc.stderr) == [removed], proc.stderr[-3000:]
    record = json.loads((copy / "records" / f"{removed}.json").read_text())
    assert record["where"] == "local pod, 1 host(s)" and record["status"] == "ok", record

    def losses(root):
        return {r["step"]: r["train/loss"] for r in read_metrics(root / "runs" / removed / "metrics.jsonl")}

    assert losses(copy) == losses(out)
    finished = json.loads((copy / "compare.json").read_text())
    assert finished["arms"]["mars-adamw"]["final_val_losses"] == summary["arms"]["mars-adamw"]["final_val_losses"]

    # The eval table: each arm's row is the mean of its seeds' accuracies, as each evaluation wrote them.
    table = finished["eval_suite"]["table"]
    for arm in ("adamw", "mars-adamw"):
        point = summary["arms"][arm]["best_label"]
        accuracies = [json.loads((copy / "evals" / f"{spec_name(spec)}-{arm}-{point}-s{seed}" / "results.json")
                                 .read_text())["results"]["pydocs_mc"]["acc,none"] for seed in summary["final_seeds"]]
        row = next(line for line in table.splitlines() if line.startswith(f"| {arm} |"))
        assert row.split("|")[2].strip() == f"{100 * sum(accuracies) / len(accuracies):.2f}", (row, accuracies)
    assert "Downstream evals" in (copy / "compare.md").read_text()


def spec_name(spec: Path) -> str:
    return yaml.safe_load(spec.read_text())["name"]


def test_a_run_whose_lease_another_launch_holds_is_reported_as_live_elsewhere_not_as_a_config_error(nano, tmp_path):
    """Another launch (here: this test's process) holds the lease of a run the comparison still needs: the run
    refuses (exit 8), and so does the comparison, saying so, with nothing trained."""
    from levanter_mars.training.run.lease import RunLease

    spec, out, _, _, _ = nano
    copy, held = _copy_without_run(out, tmp_path, "adamw", 2)
    lease = RunLease.acquire(str(copy / "checkpoints" / f"{held}.lease.json"), held)
    try:
        proc = run_compare(spec, "--output_dir", str(copy))
    finally:
        lease.release()
    assert proc.returncode == 8, proc.stderr[-3000:]
    assert f"error: run {held} is live elsewhere: another launch holds its lease" in proc.stderr
    assert "config error" not in proc.stderr and not (copy / "records" / f"{held}.json").exists()
