"""The families x optimizers tables of docs/model_families.md are generated from docs/benchmarks/family_matrix.json
(scripts/family_matrix.py --record), and that JSON records every pair and every per-family check as it ran."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.scripts import load_script
from tests.helpers.training import REPO

RECORD = REPO / "docs" / "benchmarks" / "family_matrix.json"


@pytest.fixture(scope="module")
def script():
    return load_script("family_matrix")


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def test_docs_tables_are_rendered_from_the_json(script, record):
    text = script.DOC.read_text()
    start = text.index(script.BEGIN) + len(script.BEGIN)
    assert text[start:text.index(script.END, start)].strip() == script.render(record).strip(), (
        "docs/model_families.md is stale: rerun scripts/family_matrix.py --record"
    )


def test_each_pair_is_recorded_at_most_once_and_the_table_has_every_pair(script, record):
    pairs = [(r["family"], r["optimizer"]) for r in record["matrix"]]
    assert len(set(pairs)) == len(pairs) and set(pairs) <= {(f, o) for f in script.FAMILIES for o in script.OPTIMIZERS}
    families = [r["family"] for r in record["checks"]]
    assert len(set(families)) == len(families) and set(families) <= set(script.FAMILIES)
    table = script.render(record).splitlines()
    assert len([line for line in table if line.startswith("| ") and "|---" not in line]) == (
        2 + len(script.FAMILIES) * (len(script.OPTIMIZERS) + 1)  # two headers, every pair, every family's check
    )


def test_recorded_rows_are_consistent(script, record):
    for r in record["matrix"]:
        if r["rc"] == 0:  # a run that passed trained every step, evaluated twice and has finite losses
            assert r["steps"] == record["steps"], r
            losses = (r["train_first"], r["train_last"], r["eval_first"], r["eval_last"])
            assert all(isinstance(x, float) and math.isfinite(x) for x in losses), r
        else:
            assert r.get("error"), f"{r['family']} x {r['optimizer']} failed without its error recorded"
    for r in record["checks"]:
        if script.check_passed(r):
            assert 0.0 <= r["harness_acc"] <= 1.0 and r["harness_step"] == record["steps"] - 1, r
            assert r["killed_steps"] < record["steps"], r
