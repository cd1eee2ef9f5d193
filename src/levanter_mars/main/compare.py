"""``python -m levanter_mars.main.compare --config_path config/compare/X.yaml [--output_dir DIR] [--parallel N]
[--tpu_type cpu|v4-32 ...] [--field value ...] [-- training overrides for every run]``

A fair, tuned, seeded comparison of optimizers: every arm tunes its learning rate (and any other field of its grid)
on the same base run, the best point of each trains on every seed, and each arm is measured against the baseline in
tokens and seconds to the baseline's final loss, with bootstrap intervals over seeds. Writes ``compare.json``,
``compare.md`` and ``compare.png`` in the output directory (default ``runs/compare/<name>``), beside every run.

Rerunning the command finishes what is missing: completed runs are read back, never retrained; partial ones resume
from their checkpoints; a seed or an arm added later reuses everything done. Exit 0 when the comparison is complete,
2 for a bad spec or run config (before any run starts), 1 when a run failed (rerun to retry it), 130 on Ctrl-C.

The program's order: parse the spec; check every run's config with the training program's own validation; build
what local runs share (corpus, token caches); run what is missing; write the outputs.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

from levanter_mars.compare.spec import SpecError, parse


def _report(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    spec, overrides, spec_path = parse(argv)
    # Light imports above: a bad spec is reported without loading Levanter.
    from levanter_mars.compare import comparison as comparisons

    comparison = comparisons.open_comparison(spec, overrides)
    plan = comparison.plan()
    reused = sum(1 for k in plan.runs if k in comparison.records and comparison.records[k].status != "failed")
    _report(f"comparison {spec.name}: {len(plan.runs)} runs planned so far, {reused} done before; "
            f"output in {spec.output_dir}")  # fmt: skip
    if spec.dry_run:
        print(comparisons.describe_plan(comparison, plan))
        return 0
    comparisons.prepare_shared(comparison)
    try:
        plan = comparisons.run_missing(comparison, _report)
    except KeyboardInterrupt:
        _report("interrupted: the runs were stopped; rerun the same command to finish (runs resume)")
        _write(comparison, comparison.plan(), spec_path)
        return 130
    evals = None
    if spec.eval_suite and plan.done:
        from levanter_mars.compare import evals as arm_evals

        try:
            evals = arm_evals.table(comparison, arm_evals.evaluate_arms(comparison, plan, _report))
        except RuntimeError as e:
            _report(f"error: {e}")
            _write(comparison, plan, spec_path)
            return 1
    paths = _write(comparison, plan, spec_path, evals)
    print(open(paths["md"]).read())
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    if not plan.done:
        failed = [rid for rid in (comparison.records[k].run_id for k in comparison.failed_now)]
        _report(f"incomplete: {len(plan.pending)} run(s) missing (failed here: {', '.join(failed) or 'none'}); "
                "rerun the same command to retry them")  # fmt: skip
        return 1
    return 0


def _write(comparison, plan, spec_path: str, evals: Optional[str] = None) -> dict[str, str]:
    from levanter_mars.compare.outputs import write_all
    from levanter_mars.compare.summary import summarize

    summary = summarize(comparison, plan, spec_path)
    if evals is not None:
        summary["eval_suite"] = {"suite": comparison.spec.eval_suite, "table": evals}
    return write_all(summary, comparison.spec.output_dir)


def cli(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        return main(sys.argv[1:] if argv is None else list(argv))
    except SpecError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
