"""Re-measures a finished comparison's record (its compare.json, whose runs keep their eval curves) with the current
measures, on the final seeds given: for a record written before the tuning seeds were kept out of the figures and
before its intervals were Student t (issue 53). Nothing is trained; each arm keeps the best point its record chose.

    python scripts/resummarize_compare.py --record docs/benchmarks/compare_cpu_study_3seeds.json \\
        --final_seeds 1 2 --pairs mars-m:muon --output docs/benchmarks/compare_cpu_study_fresh_seeds.json

The output names the record it read, the seeds the figures use and exclude, each interval's method, and the versions
that trained the runs (the record's) beside those that measured them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from levanter_mars.compare import measure
from levanter_mars.compare.summary import figures_entry, record_versions


def _curve(run: dict) -> measure.Curve:
    return measure.Curve(tuple(run["eval_tokens"]), tuple(run["eval_losses"]))


def _final_runs(record: dict, arm: str, seeds: list[int]) -> list[dict]:
    best = record["arms"][arm]["best_point"]
    runs = {r["seed"]: r for r in record["runs"] if r["arm"] == arm and r["point"] == best and r["status"] == "ok"}
    missing = [s for s in seeds if s not in runs]
    if missing:
        raise SystemExit(f"{arm}: the record has no finished run of its best point {best} for seeds {missing}")
    return [runs[s] for s in seeds]


def _against(record: dict, arm: str, reference: str, seeds: list[int], confidence: float) -> dict:
    reference_runs, runs = _final_runs(record, reference, seeds), _final_runs(record, arm, seeds)
    reference_spt = statistics.fmean(r["seconds_per_token"] for r in reference_runs)
    spt = statistics.fmean(r["seconds_per_token"] for r in runs)
    figures = measure.measure_arm([_curve(r) for r in reference_runs], [_curve(r) for r in runs], seeds,
                                  confidence=confidence)  # fmt: skip
    return {"final_val_losses": [r["final_val_loss"] for r in runs], "final_val_loss": figures.final_loss,
            "seconds_per_token": spt,
            **figures_entry(figures, reference_spt, spt)}  # fmt: skip


def resummarize(record: dict, seeds: list[int], confidence: float, pairs: list[tuple[str, str]]) -> dict:
    baseline = record["baseline"]
    arms = {arm: {"best_point": entry["best_point"], **_against(record, arm, baseline, seeds, confidence)}
            for arm, entry in record["arms"].items()}  # fmt: skip
    pair_figures = [{"arm": arm, "reference": reference, **_against(record, arm, reference, seeds, confidence)}
                    for arm, reference in pairs]  # fmt: skip
    return {
        "comparison": record["comparison"],
        "record": None,
        "about": "The record's runs re-measured on final seeds its tuning never saw, with Student t intervals; "
                 "each arm at the best point the record chose on its tuning seeds.",
        "final_seeds": seeds,
        "tuning_seeds": record.get("tuning_seeds"),
        "excluded_seeds": sorted(set(record.get("seeds", [])) - set(seeds)),
        "confidence": confidence,
        "baseline": baseline,
        "target_val_loss": statistics.fmean(r["final_val_loss"] for r in _final_runs(record, baseline, seeds)),
        "budget": record.get("budget"),
        "trained_with": record.get("versions"),
        "trained_by_command": record.get("command"),
        "arms": arms,
        "pairs": pair_figures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, required=True, help="a comparison's compare.json")
    parser.add_argument("--final_seeds", type=int, nargs="+", required=True)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--pairs", nargs="*", default=[], metavar="ARM:REFERENCE",
                        help="arms measured against another arm than the baseline, paired by seed")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    record = json.loads(args.record.read_text())
    tuning = set(record.get("tuning_seeds") or [])
    if tuning & set(args.final_seeds):
        parser.error(f"--final_seeds {sorted(tuning & set(args.final_seeds))} were the record's tuning seeds")
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    unknown = sorted({name for pair in pairs for name in pair} - set(record["arms"]))
    if unknown or any(len(p) != 2 for p in pairs):
        parser.error(f"--pairs: ARM:REFERENCE, each an arm of the record (unknown: {unknown})")
    summary = resummarize(record, args.final_seeds, args.confidence, pairs)
    summary["record"] = str(args.record)
    summary["command"] = "python scripts/resummarize_compare.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summary["versions"] = record_versions()
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    rows = [(arm, entry) for arm, entry in summary["arms"].items()]
    rows += [(f"{p['arm']} vs {p['reference']}", p) for p in summary["pairs"]]
    for arm, entry in rows:
        print(f"{arm}: final {entry['final_val_loss']:.4f}, difference "
              f"{entry['final_val_loss_difference']:+.4f} {entry['final_val_loss_difference_interval']} "
              f"({entry['final_val_loss_difference_interval_method']}), speed-up {entry['speedup']} "
              f"{entry['speedup_interval']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
