"""``python -m levanter_mars.main.compare --config_path config/compare/X.yaml [--output_dir DIR] [--parallel N]
[--tpu_type cpu|v4-32 ...] [--field value ...] [-- training overrides for every run]``

A fair, tuned, seeded comparison of optimizers: every arm tunes its learning rate (and any other field of its grid)
on the same base run and its tuning seeds, the best point of each trains on the final seeds (none of them a tuning
seed), and each arm is measured against the baseline on those in tokens and seconds to the baseline's final loss,
with Student t intervals over the seeds. Writes ``compare.json``, ``compare.md`` and ``compare.png`` in the output
directory (default ``runs/compare/<name>``), beside every run.

Rerunning the command finishes what is missing: completed runs are read back, never retrained; partial ones resume
from their checkpoints; a seed or an arm added later reuses everything done. Exit codes:

| code | meaning |
| --- | --- |
| 0 | complete |
| 1 | a run failed (a crash, a kill, a lost host): rerun to retry it |
| 2 | a bad spec or run config, before any run starts (or a run refused its config) |
| 3 | a best point's final run diverged (named in compare.md; 0 with ``final_runs_may_diverge: true``), or the baseline diverged (no target) |
| 4 | a run's data ran out before its budget (the same on every rerun: give the base more data or fewer steps) |
| 8 | a run is live elsewhere: another launch holds its lease (another comparison in the same directory) |
| 130, 143, 129 | stopped by Ctrl-C, SIGTERM or SIGHUP (a closed terminal): the runs were stopped first; rerun to finish |

The program's order: parse the spec; check every run's config with the training program's own validation; build
what local runs share (corpus, token caches); run what is missing; write the outputs.
"""

from __future__ import annotations

import logging
import signal
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
    except (KeyboardInterrupt, Stopped) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        _report(f"stopped by {signal.Signals(signum).name}: the runs were stopped; rerun the same command to finish "
                "(runs resume)")  # fmt: skip
        _write(comparison, comparison.plan(), spec_path)
        return 128 + signum
    except comparisons.RunLiveElsewhere as e:
        from levanter_mars.training.errors import ExitCode

        _report(f"error: {e}")
        _write(comparison, comparison.plan(), spec_path)
        return ExitCode.LIVE_ELSEWHERE
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
    return _verdict(comparison, plan, paths)


def _verdict(comparison, plan, paths) -> int:
    """The exit code of a comparison that ran what it could (the table in the module's docstring)."""
    import json

    summary = json.loads(open(paths["json"]).read())
    exhausted = [r["run_id"] for r in summary["runs"] if r["status"] == "data_exhausted"]
    if exhausted:
        _report(f"error: the data ran out before the budget in {', '.join(exhausted)} (exit 4 of the training "
                "program, the same on every rerun): give the base config more data or fewer steps")  # fmt: skip
        return 4
    baseline = [p for p in summary["problems"] if p["kind"] == "baseline_diverged"]
    if baseline:
        _report(f"error: the baseline ({comparison.spec.baseline}) diverged ({baseline[0]['run'] or 'every point'}): "
                "there is no target; see compare.md")  # fmt: skip
        return 3
    if not plan.done:
        failed = [rid for rid in (comparison.records[k].run_id for k in comparison.failed_now)]
        _report(f"incomplete: {len(plan.pending)} run(s) missing (failed here: {', '.join(failed) or 'none'}); "
                "rerun the same command to retry them")  # fmt: skip
        return 1
    diverged = [p for p in summary["problems"] if p["kind"] != "baseline_diverged"]
    if diverged:
        named = ", ".join(p["run"] or f"{p['arm']} (every point)" for p in diverged)
        _report(f"{'note' if comparison.spec.final_runs_may_diverge else 'error'}: diverged, so without figures: "
                f"{named} (compare.md)")  # fmt: skip
        return 0 if comparison.spec.final_runs_may_diverge else 3
    return 0


def _write(comparison, plan, spec_path: str, evals: Optional[str] = None) -> dict[str, str]:
    from levanter_mars.compare.outputs import write_all
    from levanter_mars.compare.summary import summarize

    summary = summarize(comparison, plan, spec_path)
    if evals is not None:
        summary["eval_suite"] = {"suite": comparison.spec.eval_suite, "table": evals}
    return write_all(summary, comparison.spec.output_dir)


class Stopped(BaseException):
    """SIGTERM or SIGHUP (a closed ssh connection): stop like Ctrl-C, the runs first (they run in sessions of their
    own, which a terminal's hangup does not reach)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_stopping: list[int] = []


def _stop(signum, frame):
    if _stopping:  # a second signal while the runs are being stopped: the stop is under way, let it finish
        return
    _stopping.append(signum)
    raise Stopped(signum)


def cli(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    try:
        return main(sys.argv[1:] if argv is None else list(argv))
    except SpecError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except Stopped as e:  # before any run started
        return 128 + e.signum


if __name__ == "__main__":
    sys.exit(cli())
