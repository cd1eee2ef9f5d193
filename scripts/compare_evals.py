"""Merges several runs' eval results into one table in the MARS paper's layout (one row per run, plus the average).

    python scripts/compare_evals.py runs/adamw/eval/paper/step-100000 runs/mars/eval/paper/step-100000 \
        --label AdamW --label MARS-AdamW [--suite config/eval/paper.yaml] [--output comparison.md]

Each argument is a ``results.json`` written by ``levanter_mars.main.eval_harness`` or by the in-training
evaluation, or the directory holding it. Columns come from ``--suite`` if given, else from the files themselves.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import yaml

from levanter_mars.eval.report import TableColumn, comparison_table


def suite_columns(path: str) -> list[TableColumn]:
    with open(path) as f:
        suite = yaml.safe_load(f) or {}
    return [TableColumn(**column) for column in suite.get("columns") or []]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results.json files or directories holding one")
    parser.add_argument("--label", action="append", help="row label, once per results (default: run name and step)")
    parser.add_argument("--suite", help="an eval suite YAML whose `columns` define the table")
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.results):
        parser.error(f"got {len(args.label)} --label for {len(args.results)} results")
    try:
        table = comparison_table(args.results, args.label, suite_columns(args.suite) if args.suite else ())
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(table, end="")
    if args.output:
        with open(args.output, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
