"""A comparison's record: every run, every grid point, each arm's best point and its figures against the baseline
(``compare.measure`` defines them). ``compare.json`` is this record; the table and the picture are drawn from it."""

from __future__ import annotations

import statistics
from typing import Any, Optional

from levanter_mars import versions
from levanter_mars.compare import measure
from levanter_mars.compare.comparison import Comparison
from levanter_mars.compare.plan import ArmPlan, Plan, RunKey, point_label, run_id

DEFINITIONS = {
    "target": "the baseline's mean final val loss over seeds at its best point",
    "tokens_to_target": "tokens at which the arm's seed-mean val-loss curve first reaches the target (linear "
                        "interpolation between eval points; null if never)",
    "speedup": "baseline's tokens to target / the arm's (> 1: faster)",
    "final_val_loss_difference": "arm's mean final val loss - baseline's (< 0: lower)",
    "intervals": "percentile bounds of a seeded bootstrap over seeds, paired across arms (a seed is one "
                 "initialization and one data order for every arm); a resample where the arm never reaches the "
                 "target ranks lowest, and a lower bound there is null",
    "seconds_per_token": "median step time of the arm's best-point runs after their first 3 steps / tokens per step",
    "time_speedup": "speedup x baseline's seconds per token / the arm's",
    "best_point": "lowest mean final val loss on the tuning seeds; a point with a diverged or failed run loses",
}  # fmt: skip


def summarize(comparison: Comparison, plan: Plan, spec_path: str) -> dict[str, Any]:
    spec, budget = comparison.spec, comparison.budget
    arms = {name: _arm_entry(comparison, arm_plan) for name, arm_plan in plan.arms.items()}
    baseline = arms[spec.baseline]
    target = None
    if baseline["final_runs_complete"]:
        target = statistics.fmean(baseline["final_val_losses"])
        for name, entry in arms.items():
            _against_baseline(comparison, name, entry, baseline, plan)
    incomplete = [run_id(spec, k) for k in plan.pending]
    return {
        "comparison": spec.name,
        "spec": spec_path,
        "command": versions.command_line(),
        "versions": _versions(),
        "machine": _machine(),
        "where": _where(spec),
        "complete": plan.done,
        "incomplete_runs": incomplete,
        "budget": {
            "num_train_steps": budget.num_train_steps,
            "tokens_per_step": budget.tokens_per_step,
            "tokens_per_run": budget.num_train_steps * budget.tokens_per_step,
            "steps_per_eval": budget.steps_per_eval,
            "model": budget.model,
        },
        "base": spec.base,
        "corpus": _corpus(comparison),
        "overrides": comparison.overrides,
        "seeds": spec.seeds,
        "tuning_seeds": spec.tuning_seeds,
        "parallel": spec.parallel,
        "baseline": spec.baseline,
        "target_val_loss": target,
        "interval": {"confidence": spec.interval.confidence, "samples": spec.interval.samples,
                     "seed": spec.interval.seed},  # fmt: skip
        "definitions": DEFINITIONS,
        "arms": arms,
        "runs": [_run_entry(comparison, key) for key in plan.runs],
    }


def _arm_entry(comparison: Comparison, arm_plan: ArmPlan) -> dict[str, Any]:
    spec = comparison.spec
    arm = spec.arm(arm_plan.arm)
    points = []
    for point in arm_plan.points:
        runs = [comparison.records.get(RunKey(arm.name, point, s)) for s in spec.tuning_seeds]
        points.append({
            "point": dict(point),
            "label": point_label(point),
            "tuning_val_loss": arm_plan.scores.get(point),
            "statuses": [r.status if r else "pending" for r in runs],
            "added_past_edge": point not in _grid(arm),
        })  # fmt: skip
    entry: dict[str, Any] = {
        "optimizer": arm.optimizer,
        "grid": arm.grid,
        "points": points,
        "tuned": arm_plan.tuned,
        "best_point": dict(arm_plan.best) if arm_plan.best is not None else None,
        "best_label": point_label(arm_plan.best) if arm_plan.best is not None else None,
        "edge": arm_plan.edges(),
        "extensions": arm_plan.extensions,
        "diverged_points": [p["label"] for p in points if "diverged" in p["statuses"]],
        "all_diverged": arm_plan.tuned and arm_plan.best is None,
        "final_runs_complete": False,
    }
    if arm_plan.best is None:
        return entry
    keys = [RunKey(arm.name, arm_plan.best, s) for s in spec.seeds]
    results = [comparison.results.get(k) for k in keys]
    statuses = [comparison.records[k].status if k in comparison.records else "pending" for k in keys]
    entry["final_statuses"] = statuses
    if any(s != "ok" for s in statuses):
        return entry
    curves = [r.curve for r in results]
    mean = measure.mean_curve(curves)
    entry.update({
        "final_runs_complete": True,
        "seeds": spec.seeds,
        "final_val_losses": [c.final for c in curves],
        "final_val_loss": statistics.fmean(c.final for c in curves),
        "curve": {"tokens": list(mean.tokens), "mean": list(mean.losses),
                  "min": [min(c.losses[i] for c in curves) for i in range(len(mean.tokens))],
                  "max": [max(c.losses[i] for c in curves) for i in range(len(mean.tokens))]},
        "seconds_per_token": _mean([r.seconds_per_token for r in results]),
    })  # fmt: skip
    return entry


def _against_baseline(comparison: Comparison, name: str, entry: dict, baseline: dict, plan: Plan) -> None:
    if not entry["final_runs_complete"]:
        return
    spec = comparison.spec

    def curves(arm: str) -> list[measure.Curve]:
        return [comparison.results[RunKey(arm, plan.arms[arm].best, s)].curve for s in spec.seeds]

    figures = measure.measure_arm(curves(spec.baseline), curves(name), spec.seeds,
                                  confidence=spec.interval.confidence, samples=spec.interval.samples,
                                  seed=spec.interval.seed)  # fmt: skip
    entry.update({
        "final_val_loss_interval": figures.final_loss_interval.as_list(),
        "final_val_loss_difference": figures.final_loss_difference,
        "final_val_loss_difference_interval": figures.final_loss_difference_interval.as_list(),
        "tokens_to_target": figures.tokens_to_target,
        "speedup": figures.speedup,
        "speedup_interval": figures.speedup_interval.as_list(),
        "not_reached_fraction": figures.not_reached_fraction,
        "time_speedup": measure.time_speedup(figures.speedup, baseline.get("seconds_per_token"),
                                             entry.get("seconds_per_token")),  # fmt: skip
    })  # fmt: skip


def _corpus(comparison: Comparison) -> Optional[dict[str, Any]]:
    """The embedded corpus the runs trained on, from its manifest: sources, documents, characters, tokens, and how many
    installed distributions it was built from (the manifest lists them)."""
    import json
    import os

    config = comparison.config_of(comparison.plan().runs[0])
    directory = config.get("embedded_corpus")
    path = os.path.join(directory, "corpus.json") if directory else None
    if path is None or not os.path.exists(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    out = {k: manifest.get(k) for k in ("sources", "documents", "characters", "tokens")}
    out["directory"] = directory
    out["distributions"] = len(manifest.get("distributions", []))
    return out


def _run_entry(comparison: Comparison, key: RunKey) -> dict[str, Any]:
    record = comparison.records.get(key)
    result = comparison.results.get(key)
    return {
        "run_id": run_id(comparison.spec, key),
        "arm": key.arm,
        "point": dict(key.point),
        "seed": key.seed,
        "status": record.status if record else "pending",
        "exit_code": record.exit_code if record else None,
        "seconds": record.seconds if record else None,
        "where": record.where if record else None,
        "trained_by": record.trained_by if record else None,
        "config": comparison.config_of(key),
        "config_digest": record.config_digest if record else None,
        "final_val_loss": result.curve.final if result else None,
        "seconds_per_token": result.seconds_per_token if result else None,
        "eval_tokens": list(result.curve.tokens) if result else None,
        "eval_losses": list(result.curve.losses) if result else None,
    }


def _grid(arm) -> set:
    from levanter_mars.compare.plan import grid_points

    return set(grid_points(arm))


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _versions() -> dict[str, Optional[str]]:
    out = {p: versions.installed(p) for p in ("jax", "jaxlib", "libtpu", "levanter", "haliax", "optax", "equinox")}
    out["levanter-mars"] = versions.source_commit()
    return out


def _machine() -> dict[str, Any]:
    from levanter_mars.bench.report import host_description

    return host_description()


def _where(spec) -> str:
    from levanter_mars.compare.execute import where

    return where(spec)
