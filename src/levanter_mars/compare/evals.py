"""The downstream eval suite at the end of each arm (``eval_suite`` in the spec): the existing standalone harness
(``python -m levanter_mars.main.eval_harness``) on the final checkpoint of each arm's best point, every seed, and one
table in ``scripts/compare_evals.py``'s format, averaged over seeds per arm.

Each evaluation is a process of its own, as a user would run it; its results land in
``<output_dir>/evals/<run id>/results.json`` and are read back, not evaluated again, when the comparison is rerun.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Optional

from levanter_mars.compare.comparison import Comparison
from levanter_mars.compare.tuning import Plan, RunKey, run_id


def results_path(comparison: Comparison, rid: str) -> str:
    return comparison.layout.path("evals", rid, "results.json")


def evaluate_arms(comparison: Comparison, plan: Plan, report: Callable[[str], None]) -> dict[str, list[str]]:
    """Evaluates what is not evaluated yet; returns each arm's results files (by seed). Raises RuntimeError naming
    the log of an evaluation that failed."""
    spec = comparison.spec
    found: dict[str, list[str]] = {}
    for arm, arm_plan in plan.arms.items():
        if arm_plan.best is None:
            continue
        for seed in spec.final_seeds:
            rid = run_id(spec, RunKey(arm, arm_plan.best, seed))
            path = results_path(comparison, rid)
            if not os.path.exists(path):
                _evaluate(comparison, rid, path, report)
            found.setdefault(arm, []).append(path)
    return found


def _evaluate(comparison: Comparison, rid: str, path: str, report: Callable[[str], None]) -> None:
    log = comparison.layout.path("logs", f"{rid}.eval.log")
    command = [sys.executable, "-m", "levanter_mars.main.eval_harness", "--config_path", comparison.spec.eval_suite,
               "--train_config_path", comparison.layout.config_path(rid), "--output_dir", os.path.dirname(path),
               "--run_name", rid]  # fmt: skip
    report(f"evaluating {rid} on {os.path.basename(comparison.spec.eval_suite)}; log: {log}")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0 or not os.path.exists(path):
        raise RuntimeError(f"the eval suite failed on {rid} (exit {code}): see {log}")


def table(comparison: Comparison, results: dict[str, list[str]]) -> Optional[str]:
    """One row per arm, its seeds' results averaged, in ``scripts/compare_evals.py``'s format (the suite's columns,
    percent, and their average)."""
    from levanter_mars.eval.report import load_results, markdown_table, stored_columns, table_row

    if not results:
        return None
    merged = {arm: _seed_mean([load_results(p) for p in paths]) for arm, paths in results.items()}
    columns = stored_columns(next(iter(merged.values())))
    seeds = len(comparison.spec.final_seeds)
    return markdown_table([table_row(arm, record, columns) for arm, record in merged.items()],
                          header=f"Arm (mean of {seeds} seed(s), best point)")  # fmt: skip


def _seed_mean(records: list[dict]) -> dict:
    """Several seeds' results as one: each numeric metric averaged over them."""
    merged = {**records[0], "results": {}}
    for task, metrics in records[0].get("results", {}).items():
        merged["results"][task] = dict(metrics)
        for name in metrics:
            values = [r.get("results", {}).get(task, {}).get(name) for r in records]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                merged["results"][task][name] = sum(values) / len(values)
    return merged
