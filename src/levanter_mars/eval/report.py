"""Results files and the results table in the MARS paper's layout (one row per run, one column per task, average).

Every evaluation, in training or standalone, writes a directory with

* ``results.json``: lm-eval's output as Levanter returns it (``results``, ``n-samples``, ``configs``, ...,
  ``samples`` if ``log_samples`` is set, Levanter's ``averages``), plus a ``levanter_mars`` section: the run name,
  step, checkpoint and the table columns;
* ``results.md``: the table with this one run.

:func:`comparison_table` merges several ``results.json`` into one table (``scripts/compare_evals.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import fsspec
import numpy as np

RESULTS_JSON = "results.json"
RESULTS_TABLE = "results.md"
AVERAGE_LABEL = "Avg."
_PREFERRED_METRICS = ("acc_norm", "acc")


@dataclass(frozen=True)
class TableColumn:
    """One column of the results table (an eval suite's ``columns``)."""

    task: str
    """The task (or group, e.g. ``mmlu``) as it appears in lm-eval's results (its alias, if it has one)."""
    label: Optional[str] = None
    """The column heading; defaults to the task name."""
    metric: Optional[str] = None
    """The lm-eval metric (``acc``, ``acc_norm``); defaults to ``acc_norm`` where the task reports it, else ``acc``."""


@dataclass(frozen=True)
class Row:
    label: str
    values: dict[str, Optional[float]]
    """Column label -> score in percent (None: the task was not evaluated)."""

    @property
    def average(self) -> Optional[float]:
        """The mean over all columns, as in the paper; None if any is missing (it would not be comparable)."""
        values = list(self.values.values())
        if not values or any(v is None for v in values):
            return None
        return float(np.mean(values))


@dataclass(frozen=True)
class WrittenResults:
    json_path: str
    table_path: str
    table: str


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)  # callables in task configs (process_docs, ...)


def default_columns(outputs: Mapping[str, Any]) -> list[TableColumn]:
    """One column per evaluated top-level task or group, in evaluation order."""
    results = outputs.get("results", {})
    subtasks = {t for children in (outputs.get("group_subtasks") or {}).values() for t in children}
    return [TableColumn(task=name) for name in results if name not in subtasks]


def table_columns(outputs: Mapping[str, Any], columns: Sequence[TableColumn] = ()) -> list[TableColumn]:
    """``columns``, then one column for each evaluated top-level task that none of them names (e.g. a task added
    with ``--task_spec`` to a suite whose ``columns`` list others): every evaluated task shows in the table."""
    columns = list(columns)
    named = {column.task for column in columns}
    return columns + [column for column in default_columns(outputs) if column.task not in named]


def metric_value(task_results: Mapping[str, Any], metric: Optional[str]) -> Optional[float]:
    """A metric of one task's lm-eval results (keys look like ``acc,none``), as a fraction."""
    candidates = (metric,) if metric else _PREFERRED_METRICS
    for name in candidates:
        for key, value in task_results.items():
            if key.split(",")[0] == name and isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def table_row(label: str, outputs: Mapping[str, Any], columns: Sequence[TableColumn]) -> Row:
    results = outputs.get("results", {})
    values: dict[str, Optional[float]] = {}
    for column in columns:
        value = metric_value(results.get(column.task, {}), column.metric)
        values[column.label or column.task] = None if value is None or math.isnan(value) else 100.0 * value
    return Row(label, values)


def markdown_table(rows: Sequence[Row], header: str = "Run") -> str:
    labels = list(dict.fromkeys(label for row in rows for label in row.values))
    lines = [
        "| " + " | ".join([header, *labels, AVERAGE_LABEL]) + " |",
        "|" + "---|" + "---:|" * (len(labels) + 1),
    ]
    for row in rows:
        cells = [_format(row.values.get(label)) for label in labels]
        lines.append("| " + " | ".join([row.label, *cells, _format(row.average)]) + " |")
    return "\n".join(lines) + "\n"


def _format(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}"


def run_label(run_name: str, step: Optional[int]) -> str:
    return run_name if step is None else f"{run_name} (step {step})"


def write_results(
    outputs: dict,
    directory: str,
    *,
    run_name: str,
    step: Optional[int],
    checkpoint: Optional[str],
    columns: Sequence[TableColumn] = (),
) -> "WrittenResults":
    """Writes ``results.json`` and ``results.md`` into ``directory`` (local or a URL)."""
    columns = table_columns(outputs, columns)
    record = dict(outputs)
    record["levanter_mars"] = {
        "run_name": run_name,
        "step": step,
        "checkpoint": checkpoint,
        "columns": [dataclasses.asdict(c) for c in columns],
    }
    fs, root = fsspec.core.url_to_fs(directory)
    fs.makedirs(root, exist_ok=True)
    written = WrittenResults(
        posixpath.join(directory, RESULTS_JSON),
        posixpath.join(directory, RESULTS_TABLE),
        markdown_table([table_row(run_label(run_name, step), outputs, columns)]),
    )
    with fsspec.open(written.json_path, "w") as f:
        json.dump(record, f, indent=1, default=_json_default)
    with fsspec.open(written.table_path, "w") as f:
        f.write(written.table)
    return written


def load_results(path: str) -> dict:
    """A ``results.json``, or the one in directory ``path``."""
    fs, plain = fsspec.core.url_to_fs(path)
    if fs.isdir(plain):
        path = posixpath.join(path, RESULTS_JSON)
    with fsspec.open(path) as f:
        try:
            record = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path} is not a results.json of an evaluation (not JSON: {e})") from e
    if not isinstance(record, dict) or "results" not in record:
        raise ValueError(f"{path} is not a results.json of an evaluation (no lm-eval `results`)")
    return record


def stored_columns(record: Mapping[str, Any]) -> list[TableColumn]:
    stored = (record.get("levanter_mars") or {}).get("columns")
    return [TableColumn(**c) for c in stored] if stored else default_columns(record)


def comparison_table(
    paths: Sequence[str], labels: Optional[Sequence[Optional[str]]] = None, columns: Sequence[TableColumn] = ()
) -> str:
    """One row per results file. Columns: ``columns``, else the union of the files' own, in order."""
    records = [load_results(p) for p in paths]
    labels = list(labels or [None] * len(records))
    if len(labels) != len(records):
        raise ValueError(f"{len(labels)} labels for {len(records)} results files")
    if not columns:
        seen: dict[tuple, TableColumn] = {}
        for record in records:
            for column in stored_columns(record):
                seen.setdefault((column.label or column.task,), column)
        columns = list(seen.values())
    rows = []
    for record, label in zip(records, labels):
        info = record.get("levanter_mars") or {}
        rows.append(table_row(label or run_label(info.get("run_name", "?"), info.get("step")), record, columns))
    return markdown_table(rows)
