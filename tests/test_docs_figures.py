"""Benchmark figures in README.md and docs/ are the numbers of the benchmark JSON they cite.

A figure is followed by ``<!-- bench: FILE PATH -->`` (``bench-history:`` for a record of an earlier compiler): FILE under docs/benchmarks/, PATH a ``/``-separated walk into
it where a list is entered by index (``goals/0``) or by the item whose field has a value (``sizes/size=small``). The
figure must be the JSON value rounded to the decimals shown.
"""

import json
import re
from pathlib import Path

import pytest

from tests.helpers.scripts import load_script

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "docs" / "benchmarks"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The figure: the last number before the comment, with at most a unit and markdown emphasis in between.
# ``bench-history:`` cites a record of an earlier compiler, kept as history (scripts/stale_tpu_figures.py leaves it out).
FIGURE = re.compile(r"((?<![\w.])-?\d+(?:\.\d+)?)(?:\*\*|[×x]|\s|MiB|GiB|ms|bytes/param)*<!-- bench(?:-history)?: (\S+) (\S+) -->")
RATIO = re.compile(r"\d+(?:\.\d+)?\s?[×x]\b")


def _lookup(data, path: str):
    for segment in path.split("/"):
        if isinstance(data, list):
            if "=" in segment:
                field, value = segment.split("=", 1)
                matches = [item for item in data if str(item.get(field)) == value]
                assert len(matches) == 1, f"{segment!r} selects {len(matches)} items"
                data = matches[0]
            else:
                data = data[int(segment)]
        else:
            data = data[segment]
    return data


def _figures():
    for document in DOCUMENTS:
        for line_number, line in enumerate(document.read_text().splitlines(), 1):
            for match in FIGURE.finditer(line):
                yield pytest.param(document, match, id=f"{document.name}:{line_number}:{match.group(1)}")


@pytest.mark.parametrize("document,match", list(_figures()))
def test_figure_is_the_benchmark_json_value(document, match):
    shown, file, path = match.groups()
    value = _lookup(json.loads((BENCHMARKS / file).read_text()), path)
    decimals = len(shown.partition(".")[2])
    assert abs(float(value) - float(shown)) <= 0.5 * 10**-decimals + 1e-12, (
        f"{document.name} shows {shown} for {file} {path}, which is {value}"
    )


def test_figures_are_cited_in_readme_and_benchmarks_page():
    cited = {match.group(2) for _, match, *_ in (p.values for p in _figures())}
    assert {"step_cpu.json", "optimizer_cpu_small_medium.json", "compare_cpu_study_3seeds.json"} <= cited, cited


def test_every_ratio_in_readme_benchmarks_section_cites_its_json():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    uncited = [m.group(0) for m in RATIO.finditer(FIGURE.sub("", section))]
    assert not uncited, f"README's benchmark figures without <!-- bench: ... -->: {uncited}"


# A table of benchmark rows: ``<!-- bench-table: FILE PATH -->`` before it, PATH the rows: a list named by their
# "optimizer" field (update and step benchmarks) or a mapping from optimizer name (convergence benchmark).
TABLE = re.compile(r"<!-- bench-table: (\S+) (\S+) -->")
FIELDS = {
    "ms (wall)": "median_ms",
    "× AdamW (wall)": "ratio_to_adamw",
    "CPU ms": "median_cpu_ms",
    "× AdamW (CPU)": "cpu_ratio_to_adamw",
    "× approx (CPU)": "cpu_ratio_to_approx",
    "state B/param": "state_bytes_per_param",
    "peak MiB": "peak_mib",
    "temp MiB": "temp_mib",
    "HLO passes": "hlo_passes",
    "copy MiB": "copy_mib",
    "best lr": "best_learning_rate",
    "best final val loss (mean of 2 seeds)": "best_final_val_loss",
    "steps to AdamW's final": "steps_to_target",
    "ratio to AdamW": "steps_ratio",
    # The update compiled by XLA:TPU for one v5e chip (bench_optimizer.py --tpu v5e --constructions donated), inside
    # the non-finite guard every trainer wraps the optimizer in and without it.
    "guarded passes": "v5e_donated_passes",
    "guarded × AdamW": "v5e_donated_ratio",
    "unguarded passes": "v5e_donated_unguarded_passes",
    "unguarded × AdamW": "v5e_donated_unguarded_ratio",
    "guard's passes": "v5e_donated_guard_passes",
    "guarded temp MiB": "v5e_donated_temp_mib",
    "unguarded temp MiB": "v5e_donated_unguarded_temp_mib",
    "unguarded copy MiB": "v5e_donated_unguarded_copy_mib",
    # The same figures with the gradient an input of its own (--constructions donated,own-gradient), and the optimizer
    # alone's bytes by where they go (bench.hlo): staged between memory spaces, moved by its own operations, in HBM.
    "own-gradient guarded passes": "v5e_own-gradient_passes",
    "own-gradient guard's passes": "v5e_own-gradient_guard_passes",
    "own-gradient unguarded passes": "v5e_own-gradient_unguarded_passes",
    **{f"{construction}unguarded {figure} passes": f"v5e_{key}_unguarded_{figure.lower()}_passes"
       for construction, key in (("", "donated"), ("own-gradient ", "own-gradient"))
       for figure in ("staging", "own", "HBM")},
}


def _at_best_lr(row):
    (best,) = [p for p in row["per_learning_rate"] if p["learning_rate"] == row["best_learning_rate"]]
    return best


#: Convergence columns that are not one field: ``(row, all rows) -> value or list of values``.
DERIVED = {
    "lr grid": lambda row, rows: [p["learning_rate"] for p in row["per_learning_rate"]],
    "per seed": lambda row, rows: _at_best_lr(row)["final_val_losses"],
    "ratio to Muon": lambda row, rows: row["steps_to_target"] and (
        row["steps_to_target"] / rows["muon"]["steps_to_target"]
    ),
    "val loss, lr 1": lambda row, rows: row["per_learning_rate"][0]["mean_final_val_loss"],
    "lr 2": lambda row, rows: row["per_learning_rate"][1]["mean_final_val_loss"],
    "lr 3": lambda row, rows: row["per_learning_rate"][2]["mean_final_val_loss"],
}


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("*") for cell in line.strip().strip("|").split("|")]


def _tables():
    for document in DOCUMENTS:
        lines = document.read_text().splitlines()
        for number, line in enumerate(lines):
            for match in TABLE.finditer(line):
                start = next(i for i in range(number + 1, len(lines)) if lines[i].startswith("|"))
                end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
                table = lines[start:end]
                yield pytest.param(match, _cells(table[0]), [_cells(row) for row in table[2:]],
                                   id=f"{document.name}:{number + 1}")


def _mismatch(shown: str, value) -> bool:
    shown = re.sub(r"\s*\((edge|seed 0)\)$", "", shown)
    if shown == "–":
        return value is not None
    if isinstance(value, list):
        parts = [p.strip() for p in shown.split(",")]
        return len(parts) != len(value) or any(_mismatch(p, v) for p, v in zip(parts, value))
    decimals = len(shown.partition(".")[2])
    return value is None or abs(float(value) - float(shown)) > 0.5 * 10**-decimals + 1e-9


@pytest.mark.parametrize("match,header,rows", list(_tables()))
def test_every_cell_of_a_benchmark_table_is_its_json_value(match, header, rows):
    file, path = match.groups()
    json_rows = _lookup(json.loads((BENCHMARKS / file).read_text()), path)
    if isinstance(json_rows, list):
        json_rows = {r["optimizer"]: r for r in json_rows}
    assert header[0] == "optimizer" and set(header[1:]) <= set(FIELDS) | set(DERIVED), header
    assert rows, "empty table"
    wrong = []
    for cells in rows:
        row = json_rows[cells[0].split(" ")[0]]
        for column, shown in zip(header[1:], cells[1:]):
            value = row[FIELDS[column]] if column in FIELDS else DERIVED[column](row, json_rows)
            if _mismatch(shown, value):
                wrong.append(f"{cells[0]} {column}: shows {shown}, JSON has {value}")
    assert not wrong, wrong


def test_the_benchmark_tables_are_checked():
    assert len(list(_tables())) >= 9


def test_pods_tables_and_config_preflight_lines_are_generated_from_the_pods_jsons():
    """docs/pods.md's sizing and topology tables, its exact-MARS note and every GPT-2 config's pre-flight comment lines
    are what scripts/size_pods.py makes from docs/pods/*.json today (a hand edit or a new JSON without ``table``
    fails)."""
    size_pods = load_script("size_pods")
    doc = (REPO / "docs" / "pods.md").read_text()
    assert size_pods.table() in doc
    assert size_pods.topology_table() in doc
    assert size_pods.exact_note() in doc
    # The note's claim, on its figures: one microbatch holds both gradients' activations, two serialize them.
    single, double, single_at_60 = size_pods.exact_figures()
    assert single["microbatches"] == single_at_60["microbatches"] == 1 and double["microbatches"] == 2
    assert single["exact"] > 1.3 * single["mars"] and single_at_60["exact"] > 1.3 * single_at_60["mars"]
    assert abs(double["exact"] - double["mars"]) < 0.05 * double["mars"]
    for config in size_pods.configs():
        lines = (REPO / config).read_text().splitlines()
        ours = [line for line in lines if line.startswith((size_pods.HEADER, size_pods.SMALLER_HEADER))]
        assert ours == size_pods.header_lines(config), config
