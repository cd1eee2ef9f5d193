"""A comparison's record: every run, every grid point, each arm's best point and its figures against the baseline
(``compare.measure`` defines them). ``compare.json`` is this record; the table and the picture are drawn from it."""

from __future__ import annotations

import statistics
from typing import Any, Optional

from levanter_mars import versions
from levanter_mars.compare import measure
from levanter_mars.compare.comparison import Comparison
from levanter_mars.compare.tuning import ArmPlan, Plan, RunKey, point_label, run_id

DEFINITIONS = {
    "figures_from": "the final seeds only: none of them is a tuning seed (the tuning's winner's curse stays out)",
    "target": "the baseline's mean final val loss over the final seeds at its best point",
    "tokens_to_target": "tokens at which the arm's seed-mean val-loss curve first reaches the target (linear "
                        "interpolation between eval points; null if never)",
    "final_val_loss_difference": "mean over final seeds of (the arm's final val loss - the baseline's, same seed); < 0: "
                                 "lower",
    "speedup": "geometric mean over final seeds of (the baseline's tokens to its own final loss / the arm's tokens to "
               "that loss, same seed); > 1: faster; null unless every seed reaches it",
    "intervals": "Student t over the final seeds (n - 1 degrees of freedom), paired by seed where two arms are "
                 "compared, each with its method beside it; it holds at its confidence for normal per-seed values",
    "resolvable_difference": "the difference interval's half-width: differences under it are within the seeds' noise",
    "seeds_to_resolve": "seeds an interval would need, at this spread, to tell the difference from 0",
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
            entry.update(_against(comparison, plan, name, spec.baseline, entry, baseline))
    pairs = [_pair(comparison, plan, arms, arm, reference) for arm, reference in spec.pairs]
    parameters = _parameters(comparison, plan)
    return {
        "comparison": spec.name,
        "spec": spec_path,
        "command": versions.command_line(),
        "versions": record_versions(),
        "machine": _machine(),
        "where": _where(spec),
        "complete": plan.done,
        "incomplete_runs": [run_id(spec, k) for k in plan.pending],
        "problems": _problems(spec, arms),
        "budget": {
            "num_train_steps": budget.num_train_steps,
            "tokens_per_step": budget.tokens_per_step,
            "tokens_per_run": budget.num_train_steps * budget.tokens_per_step,
            "steps_per_eval": budget.steps_per_eval,
            "model": budget.model,
            "parameters": parameters,
            "tokens_per_parameter": budget.num_train_steps * budget.tokens_per_step / parameters if parameters else None,
        },
        "base": spec.base,
        "corpus": _corpus(comparison),
        "overrides": comparison.overrides,
        "seeds": spec.seeds,
        "tuning_seeds": spec.tuning_seeds,
        "final_seeds": spec.final_seeds,
        "parallel": spec.parallel,
        "baseline": spec.baseline,
        "target_val_loss": target,
        "interval": {"confidence": spec.interval.confidence, "method": "Student t over the final seeds",
                     "seeds": len(spec.final_seeds)},  # fmt: skip
        "definitions": DEFINITIONS,
        "arms": arms,
        "pairs": pairs,
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
        "optimizer": comparison.arm_optimizer(arm.name),
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
    keys = [RunKey(arm.name, arm_plan.best, s) for s in spec.final_seeds]
    statuses = [comparison.records[k].status if k in comparison.records else "pending" for k in keys]
    entry["final_statuses"] = statuses
    entry["diverged_final_runs"] = [run_id(spec, k) for k, s in zip(keys, statuses) if s == "diverged"]
    if any(s != "ok" for s in statuses):
        return entry
    results = [comparison.results.get(k) for k in keys]
    curves = [r.curve for r in results]
    mean = measure.mean_curve(curves)
    entry.update({
        "final_runs_complete": True,
        "final_val_losses": [c.final for c in curves],
        "final_val_loss": statistics.fmean(c.final for c in curves),
        "final_val_loss_sd": statistics.stdev(c.final for c in curves) if len(curves) > 1 else None,
        "curve": {"tokens": list(mean.tokens), "mean": list(mean.losses),
                  "min": [min(c.losses[i] for c in curves) for i in range(len(mean.tokens))],
                  "max": [max(c.losses[i] for c in curves) for i in range(len(mean.tokens))]},
        "seconds_per_token": _mean([r.seconds_per_token for r in results]),
    })  # fmt: skip
    return entry


def _curves(comparison: Comparison, plan: Plan, arm: str) -> list[measure.Curve]:
    return [comparison.results[RunKey(arm, plan.arms[arm].best, s)].curve for s in comparison.spec.final_seeds]


def _against(comparison: Comparison, plan: Plan, name: str, reference: str, entry: dict, of_reference: dict) -> dict:
    """An arm's figures against a reference arm (both complete on the final seeds), for the arm's entry or a pair."""
    if not entry["final_runs_complete"] or not of_reference["final_runs_complete"]:
        return {}
    spec = comparison.spec
    figures = measure.measure_arm(_curves(comparison, plan, reference), _curves(comparison, plan, name),
                                  spec.final_seeds, confidence=spec.interval.confidence)  # fmt: skip
    return figures_entry(figures, of_reference.get("seconds_per_token"), entry.get("seconds_per_token"))


def figures_entry(figures: measure.ArmMeasure, reference_seconds_per_token: Optional[float],
                  seconds_per_token: Optional[float]) -> dict:  # fmt: skip
    """An arm's figures against its reference as compare.json records them."""
    return {
        "final_val_loss_interval": figures.final_loss_interval.as_list(),
        "final_val_loss_interval_method": figures.final_loss_interval.method,
        "final_val_loss_differences": list(figures.differences),
        "final_val_loss_difference": figures.final_loss_difference,
        "final_val_loss_difference_interval": figures.final_loss_difference_interval.as_list(),
        "final_val_loss_difference_interval_method": figures.final_loss_difference_interval.method,
        "resolvable_difference": figures.resolvable_difference,
        "seeds_to_resolve": figures.seeds_to_resolve,
        "within_noise": abs(figures.final_loss_difference) < figures.resolvable_difference,
        "tokens_to_target": figures.tokens_to_target,
        "speedups": list(figures.speedups),
        "speedup": figures.speedup,
        "speedup_interval": figures.speedup_interval.as_list(),
        "speedup_interval_method": figures.speedup_interval.method,
        "speedup_is_lower_bound": figures.speedup_is_lower_bound,
        "time_speedup": measure.time_speedup(figures.speedup, reference_seconds_per_token, seconds_per_token),
    }


def _pair(comparison: Comparison, plan: Plan, arms: dict, arm: str, reference: str) -> dict:
    return {"arm": arm, "reference": reference,
            **_against(comparison, plan, arm, reference, arms[arm], arms[reference])}  # fmt: skip


def _problems(spec, arms: dict) -> list[dict]:
    """What keeps figures from the record: a final run of a best point that diverged (the baseline's: no target)."""
    problems = []
    for name, entry in arms.items():
        for rid in entry.get("diverged_final_runs", []):
            kind = "baseline_diverged" if name == spec.baseline else "final_run_diverged"
            problems.append({"kind": kind, "arm": name, "run": rid})
        if entry.get("all_diverged"):
            kind = "baseline_diverged" if name == spec.baseline else "every_point_diverged"
            problems.append({"kind": kind, "arm": name, "run": None})
    return problems


def _parameters(comparison: Comparison, plan: Plan) -> Optional[int]:
    """The model's parameter count, as a run of it logged it (its ``summary.json``); None before any run ended."""
    import json
    import os

    for key in plan.runs:
        path = os.path.join(comparison.layout.path("runs"), run_id(comparison.spec, key), "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                count = json.load(f).get("parameter_count")
            if count:
                return int(count)
    return None


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
    """A run as it ended; ``kind``: ``tuning`` (a grid point on a tuning seed) or ``final`` (a best point on a final
    seed: the figures come from these alone)."""
    record = comparison.records.get(key)
    result = comparison.results.get(key)
    return {
        "run_id": run_id(comparison.spec, key),
        "arm": key.arm,
        "point": dict(key.point),
        "seed": key.seed,
        "kind": "tuning" if key.seed in comparison.spec.tuning_seeds else "final",
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
    from levanter_mars.compare.tuning import grid_points

    return set(grid_points(arm))


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def record_versions() -> dict[str, Optional[str]]:
    out = {p: versions.installed(p) for p in ("jax", "jaxlib", "libtpu", "levanter", "haliax", "optax", "equinox")}
    out["levanter-mars"] = versions.source_commit()
    return out


def _machine() -> dict[str, Any]:
    from levanter_mars.bench.report import host_description

    return host_description()


def _where(spec) -> str:
    from levanter_mars.compare.execute import where

    return where(spec)
