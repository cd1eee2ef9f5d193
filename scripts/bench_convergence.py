"""Quality per step: AdamW against each MARS variant, MARS-M and a Muon baseline, each with a learning-rate grid and 2
seeds, on the embedded corpus.

Every run goes through the training CLI (``python -m levanter_mars.main.train_lm``), one process per run, on
``config/bench_convergence.yaml``. Reports each optimizer's best final val loss (mean over seeds at its best learning
rate) and the steps its seed-mean eval curve needs to reach tuned AdamW's final val loss, as a ratio of AdamW's steps.

    nice -n 10 python scripts/bench_convergence.py --workdir .cache/bench_convergence --parallel 2 \\
        --plot docs/benchmarks/convergence_loss_curves.png --json > docs/benchmarks/convergence.json

The work directory keeps every run (configs, logs, metrics, checkpoints); rerunning the same command reuses the runs
that completed and redoes or resumes the others.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import tempfile
import time
from pathlib import Path

import yaml

from levanter_mars.bench import convergence as conv
from levanter_mars.bench import report

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = REPO / "config" / "bench_convergence.yaml"
TINY_BASE = REPO / "config" / "gpt2_tiny_mars.yaml"

# --quick: the tiny test model, a few steps, the middle learning rate, one seed: a smoke run of the whole pipeline.
QUICK_OVERRIDES = {"trainer": {"num_train_steps": 4, "steps_per_eval": 2, "max_eval_batches": 1}}
QUICK_OPTIMIZERS = ["adamw", "mars-adamw", "mars-adamw-exact"]
GOAL_STEPS_RATIO = 0.8


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_common_arguments(parser)
    parser.add_argument("--base-config", type=Path, default=None, help=f"default: {DEFAULT_BASE.relative_to(REPO)}")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--optimizers", default=None, help="comma-separated subset of: " + ", ".join(s.name for s in conv.SWEEP))
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1; --quick: 0)")
    parser.add_argument("--grid-points", type=lambda v: [int(i) for i in v.split(",")], default=None,
                        help="comma-separated indices into each optimizer's learning-rate grid (default: all; --quick: 1)")
    parser.add_argument("--learning-rates", type=lambda v: [float(x) for x in v.split(",")], default=None,
                        help="comma-separated learning rates replacing the grid of every selected optimizer")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="directory of the embedded corpus to use or build (default: <workdir>/pydocs)")
    parser.add_argument("--steps", type=int, default=None, help="override trainer.num_train_steps")
    parser.add_argument("--plot", type=Path, default=None, help="write the loss curves of the best runs to this PNG")
    parser.add_argument("--parallel", type=int, default=None, help="runs at a time (default 1; --quick: all)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: summarize the runs of --workdir that are complete (a partial sweep)")
    parser.add_argument("--run-timeout", type=float, default=1800, help="seconds before a run is stopped (default 1800)")
    return parser.parse_args(argv)


def sweep_specs(args: argparse.Namespace) -> list[conv.OptimizerSpec]:
    specs = list(conv.SWEEP)
    wanted = args.optimizers.split(",") if args.optimizers else (QUICK_OPTIMIZERS if args.quick else None)
    if wanted:
        unknown = set(wanted) - {s.name for s in specs}
        if unknown:
            raise SystemExit(f"--optimizers: unknown {sorted(unknown)}; choose from {[s.name for s in specs]}")
        specs = [s for s in specs if s.name in wanted]
    points = [1] if args.quick else args.grid_points
    if points is not None:
        specs = [dataclasses.replace(s, learning_rates=tuple(s.learning_rates[i] for i in points)) for s in specs]
    if args.learning_rates:
        specs = [dataclasses.replace(s, learning_rates=tuple(args.learning_rates)) for s in specs]
    return specs


def main(argv=None) -> None:
    args = parse_args(argv)
    report.select_platform(args.platform)  # the runs inherit JAX_PLATFORMS
    base_path = args.base_config or (TINY_BASE if args.quick else DEFAULT_BASE)
    base = yaml.safe_load(base_path.read_text())
    overrides = dict(QUICK_OVERRIDES) if args.quick else {}
    if args.steps:
        overrides = conv.deep_merge(overrides, {"trainer": {"num_train_steps": args.steps}})
    if args.corpus:
        from levanter_mars.training.data import pydocs_corpus

        overrides = conv.deep_merge(overrides, pydocs_corpus.config_section(args.corpus.resolve()))
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else ([0] if args.quick else [0, 1])
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-convergence-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    specs = sweep_specs(args)
    if args.parallel is None:  # --quick: its few tiny runs are mostly start-up, which overlaps well
        args.parallel = len(specs) if args.quick else 1

    # The main comparison (AdamW, MARS-AdamW) first, then the other variants, each seed by seed: a sweep stopped
    # early (and resumed later by the same command) has answered the main question first.
    main = (conv.BASELINE, conv.MAIN_CONTENDER)
    groups = [[s for s in specs if s.name in main], [s for s in specs if s.name not in main]]
    plan = [(spec, lr, seed) for group in groups for seed in seeds for spec in group for lr in spec.learning_rates]
    start = time.perf_counter()
    if not args.report_only:  # the corpus and its token caches, built once before any run starts
        conv.prepare_corpus(base, workdir, overrides)

    def run(item):
        spec, lr, seed = item
        result = conv.run_one(conv.run_config(base, spec, lr, seed, workdir, overrides), spec, lr, seed, workdir,
                              timeout=args.run_timeout, train=not args.report_only)
        if result is None:
            report.log(f"{conv.run_id(spec.name, lr, seed)}: not complete, left out (--report-only)")
            return None
        took = "reused" if result.seconds is None else f"{result.seconds:.0f} s"
        report.log(
            f"{result.run_id}: {result.status}, final val loss {result.final_eval_loss} ({took}, "
            f"{time.perf_counter() - start:.0f} s so far){'' if result.status == 'ok' else '; log: ' + result.log}"
        )
        return result

    # Runs are independent processes; with --parallel 2 they overlap start-up and compilation on 2 cores. This
    # benchmark measures loss per step, which does not depend on how fast a step ran.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        results = [r for r in pool.map(run, plan) if r is not None]

    summary = conv.summarize(results, specs)
    plot = None
    if args.plot:
        from levanter_mars.training.run.plots import plot_loss_curves

        best = {}
        for name, entry in summary["optimizers"].items():
            if entry["best_learning_rate"] is not None:
                rid = conv.run_id(name, entry["best_learning_rate"], seeds[0])
                best[f"{name} lr={entry['best_learning_rate']:g}"] = workdir / "runs" / rid / "metrics.jsonl"
        if best:
            args.plot.parent.mkdir(parents=True, exist_ok=True)
            plot = plot_loss_curves(best, args.plot, title=f"Best learning rate of each optimizer (seed {seeds[0]})")

    contender = summary["optimizers"].get(conv.MAIN_CONTENDER, {})
    goals = [report.goal_line("MARS-AdamW steps to AdamW's final val loss / AdamW's", contender.get("steps_ratio"), GOAL_STEPS_RATIO)]
    if contender.get("best_learning_rate") is not None and summary["target_val_loss"] is not None \
            and contender.get("steps_to_target") is None:
        goals[0] |= {"met": False, "note": "never reached within the run"}
    mars_m, muon = (summary["optimizers"].get(name, {}).get("steps_to_target") for name in ("mars-m", "muon"))
    if "mars-m" in summary["optimizers"] and "muon" in summary["optimizers"]:  # issue 12: MARS-M against Muon
        goals.append(report.goal_line("MARS-M steps to AdamW's final val loss / the Muon baseline's",
                                      mars_m / muon if mars_m and muon else None, 1.0))
    model = {k: base["model"][k] for k in ("hidden_dim", "num_layers", "num_heads", "seq_len")}
    trainer = conv.deep_merge(base["trainer"], overrides.get("trainer", {}))
    result = {
        "benchmark": "convergence",
        "quick": args.quick,
        "machine": report.host_description(),
        "base_config": str(base_path),
        "model": model,
        "train_batch_size": trainer["train_batch_size"],
        "num_train_steps": trainer["num_train_steps"],
        "steps_per_eval": trainer["steps_per_eval"],
        "seeds": seeds,
        "complete": len(results) == len(plan),
        "runs_planned": len(plan),
        "workdir": str(workdir),
        "wall_seconds": time.perf_counter() - start,
        "target_val_loss": summary["target_val_loss"],
        "optimizers": summary["optimizers"],
        "runs": [dataclasses.asdict(r) | {"final_eval_loss": r.final_eval_loss} for r in results],
        "goals": goals,
        "plot": plot,
    }

    rows = []
    for name, entry in summary["optimizers"].items():
        rows.append(
            {
                "optimizer": name,
                "best_lr": entry["best_learning_rate"],
                "edge": entry["best_lr_at_grid_edge"],
                "loss": entry["best_final_val_loss"],
                "steps": entry["steps_to_target"],
                "ratio": entry["steps_ratio"],
                **{f"lr{i}": p["mean_final_val_loss"] for i, p in enumerate(entry["per_learning_rate"])},
                "grid": ", ".join(f"{p['learning_rate']:g}" for p in entry["per_learning_rate"]),
            }
        )
    columns = [
        ("optimizer", "optimizer"),
        ("grid", "lr grid"),
        ("best_lr", "best lr"),
        ("edge", "best at grid edge"),
        ("loss", "best final val loss"),
        ("steps", "steps to AdamW's final"),
        ("ratio", "ratio to AdamW"),
    ]
    per_lr_columns = [("optimizer", "optimizer")] + [(f"lr{i}", f"val loss @ lr{i + 1}") for i in range(3)]
    tables = [
        f"Convergence: GPT-2 {model} on the embedded corpus, {trainer['num_train_steps']} steps of "
        f"{trainer['train_batch_size']} x {model['seq_len']} tokens, seeds {seeds}; target = tuned AdamW's final "
        f"val loss {summary['target_val_loss']}",
        report.format_table(rows, columns),
        report.format_table(rows, per_lr_columns, title="Final val loss (mean over seeds) at each grid point, in grid order"),
        report.format_table(goals, report.GOAL_COLUMNS, title="Goals"),
    ]
    report.emit(result, tables, args.json)


if __name__ == "__main__":
    main()
