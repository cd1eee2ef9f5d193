"""The results table (paper layout), results files, the comparison script, and lm-eval metrics in metrics.jsonl."""

import json

import pytest

from levanter_mars.eval import report
from levanter_mars.eval.report import TableColumn
from levanter_mars.training.run.metrics import JsonlMetricsTracker, read_metrics
from scripts import compare_evals
from tests.helpers.training import REPO

PAPER_SUITE = REPO / "config" / "eval" / "paper.yaml"
# The MARS paper's GPT-2 XL rows (FineWeb-Edu), in the paper's column order, and their published averages.
PAPER_XL = {
    "AdamW": ([68.22, 38.40, 61.13, 53.93, 39.00, 72.69, 54.78, 25.47, 85.30], "55.43"),
    "MARS-AdamW": ([66.54, 39.85, 63.82, 56.52, 41.20, 73.34, 56.59, 23.86, 86.00], "56.41"),
}


def lm_eval_outputs(scores: list[float], columns: list[TableColumn]) -> dict:
    """What lm-eval returns for these scores: metric keys with ",none", the other metric too, mmlu as a group."""
    results, subtasks = {}, {}
    for score, column in zip(scores, columns):
        other = "acc" if column.metric == "acc_norm" else "acc_norm"
        results[column.task] = {"alias": column.task, f"{column.metric},none": score / 100, f"{other},none": 0.01}
        if column.task == "mmlu":
            results["mmlu_anatomy"] = {"alias": " - anatomy", "acc,none": 0.99}
            subtasks["mmlu"] = ["mmlu_anatomy"]
    return {"results": results, "group_subtasks": subtasks, "n-samples": {}}


def test_the_papers_xl_rows_come_out_as_published():
    columns = compare_evals.suite_columns(str(PAPER_SUITE))
    rows = [report.table_row(name, lm_eval_outputs(scores, columns), columns) for name, (scores, _) in PAPER_XL.items()]
    lines = report.markdown_table(rows).splitlines()
    assert lines[0] == "| Run | ARC-E | ARC-C | BoolQ | HellaSwag | OBQA | PIQA | WG | MMLU | SciQ | Avg. |"
    assert lines[1] == "|---|" + "---:|" * 10
    for line, (name, (scores, average)) in zip(lines[2:], PAPER_XL.items()):
        cells = line.strip("|").split(" | ")
        assert cells[:-1] == [f" {name}", *(f"{s:.2f}" for s in scores)]
        # The paper averaged unrounded scores: from the rounded ones the mean can differ in the last digit.
        assert float(cells[-1]) == pytest.approx(float(average), abs=0.011)


def test_default_columns_are_top_level_tasks_with_acc_norm_preferred():
    outputs = {
        "results": {
            "mmlu": {"acc,none": 0.25, "alias": "mmlu"},
            "mmlu_anatomy": {"acc,none": 0.5, "alias": " - anatomy"},
            "hellaswag": {"acc,none": 0.30, "acc_norm,none": 0.40, "acc_stderr,none": 0.01},
        },
        "group_subtasks": {"mmlu": ["mmlu_anatomy"], "hellaswag": []},
    }
    columns = report.default_columns(outputs)
    assert [c.task for c in columns] == ["mmlu", "hellaswag"]
    row = report.table_row("run", outputs, columns)
    assert row.values == {"mmlu": 25.0, "hellaswag": 40.0} and row.average == pytest.approx(32.5)
    missing = report.table_row("run", outputs, [*columns, TableColumn("piqa", "PIQA")])
    assert missing.values["PIQA"] is None and missing.average is None
    assert "| run | 25.00 | 40.00 | – | – |" in report.markdown_table([missing])


def test_comparison_of_two_runs_from_their_results_files(tmp_path, capsys):
    columns = [TableColumn("hellaswag", "HellaSwag", "acc_norm"), TableColumn("boolq", "BoolQ", "acc")]
    for name, scores in {"adamw": [53.93, 61.13], "mars": [56.52, 63.82]}.items():
        written = report.write_results(
            lm_eval_outputs(scores, columns), str(tmp_path / name), run_name=name, step=100, checkpoint=None,
            columns=columns,
        )
        assert f"| {name} (step 100) | {scores[0]:.2f} | {scores[1]:.2f} |" in written.table
        assert json.loads((tmp_path / name / "results.json").read_text())["levanter_mars"]["step"] == 100
    output = tmp_path / "comparison.md"
    code = compare_evals.main(
        [str(tmp_path / "adamw"), str(tmp_path / "mars" / "results.json"), "--label", "AdamW", "--output", str(output)]
        + ["--label", "MARS"]
    )
    assert code == 0
    assert output.read_text().splitlines() == [
        "| Run | HellaSwag | BoolQ | Avg. |",
        "|---|---:|---:|---:|",
        "| AdamW | 53.93 | 61.13 | 57.53 |",
        "| MARS | 56.52 | 63.82 | 60.17 |",
    ]
    assert capsys.readouterr().out == output.read_text()
    # Without labels, rows are named by run and step; a missing file is an error, not a crash.
    assert "| mars (step 100) |" in report.comparison_table([str(tmp_path / "mars")])
    assert compare_evals.main([str(tmp_path / "nothing")]) == 1
    # Not a results file (a suite YAML, another JSON): an error naming the file.
    (tmp_path / "other.json").write_text('{"step": 3}')
    capsys.readouterr()
    for wrong in (str(PAPER_SUITE), str(tmp_path / "other.json")):
        assert compare_evals.main([str(tmp_path / "mars"), wrong]) == 1
        assert f"error: {wrong} is not a results.json" in capsys.readouterr().err


def test_metrics_logged_without_a_step_land_on_the_current_step(tmp_path):
    # Levanter's eval harness logs its results with step=None, after the step's own metrics (and W&B puts them on
    # the current step); they must reach metrics.jsonl the same way.
    tracker = JsonlMetricsTracker(tmp_path / "metrics.jsonl")
    tracker.log({"train/loss": 2.0}, step=9)
    tracker.log({"lm_eval/task/acc": 0.5}, step=None)
    tracker.log({"train/loss": 1.5}, step=10)
    tracker.flush()
    tracker.log({"lm_eval/task/acc": 0.75}, step=None)  # after the step was written: merged into it
    tracker.finish()
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 9, "train/loss": 2.0, "lm_eval/task/acc": 0.5},
        {"step": 10, "train/loss": 1.5, "lm_eval/task/acc": 0.75},
    ]


def test_an_evaluated_task_missing_from_the_suites_columns_still_gets_a_column(tmp_path):
    # `--task_spec '["my_task.yaml"]'` on a suite whose columns name other tasks: the task must show in the table.
    columns = [TableColumn("pydocs_mc", "PyDocs-MC", "acc")]
    outputs = {"results": {"my_mc": {"acc,none": 0.25}, "pydocs_mc": {"acc,none": 0.5}}, "group_subtasks": {}}
    written = report.write_results(outputs, str(tmp_path), run_name="run", step=1, checkpoint=None, columns=columns)
    assert written.table.splitlines()[0] == "| Run | PyDocs-MC | my_mc | Avg. |"
    assert "| run (step 1) | 50.00 | 25.00 | 37.50 |" in written.table
    stored = json.loads((tmp_path / "results.json").read_text())["levanter_mars"]["columns"]
    assert [c["task"] for c in stored] == ["pydocs_mc", "my_mc"]
    # A suite whose columns name every evaluated task keeps exactly its columns.
    complete = [*columns, TableColumn("my_mc", "Mine")]
    assert report.table_columns(outputs, complete) == complete
