"""The comparison's three outputs, from its record (``summary.summarize``): ``compare.json``, ``compare.md`` (the table a
paper would print) and ``compare.png`` (val loss against tokens with seed bands; the speed-ups with intervals)."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from levanter_mars.training.whole_files import write_whole


def markdown_table(rows: Sequence[dict[str, str]], columns: Sequence[tuple[str, str]], title: str = "") -> str:
    lines = [f"{title}\n" if title else ""]
    lines.append("| " + " | ".join(h for _, h in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(str(row.get(k, "")).replace("|", "\\|") for k, _ in columns) + " |" for row in rows]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_all(summary: dict[str, Any], output_dir: str) -> dict[str, str]:
    os.makedirs(output_dir, exist_ok=True)
    paths = {name: os.path.join(output_dir, f"compare.{name}") for name in ("json", "md", "png")}
    write_whole(paths["json"], json.dumps(summary, indent=1, sort_keys=False) + "\n")
    write_whole(paths["md"], markdown(summary))
    plot(summary, paths["png"])
    return paths


def _number(value: Optional[float], digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _interval(bounds: Optional[Sequence[Optional[float]]], digits: int = 4, low_none: str = "–") -> str:
    if not bounds or bounds == [None, None]:
        return ""
    low, high = bounds
    return f"[{low_none if low is None else f'{low:.{digits}f}'}, {_number(high, digits)}]"


def _tokens(value: Optional[float]) -> str:
    if value is None:
        return "not reached"
    return f"{value / 1e6:.3f}M" if value >= 1e5 else f"{value:,.0f}"


def _notes(name: str, arm: dict) -> list[str]:
    notes = []
    if arm.get("edge"):
        notes.append("best at grid edge: " + ", ".join(f"{k} {v}" for k, v in arm["edge"].items()))
    if arm.get("diverged_points"):
        notes.append("diverged in tuning: " + ", ".join(arm["diverged_points"]))
    if arm.get("all_diverged"):
        notes.append("every point diverged")
    if arm.get("diverged_final_runs"):
        notes.append("**diverged on a final seed**: " + ", ".join(arm["diverged_final_runs"]))
    elif not arm.get("final_runs_complete", "final_val_loss_difference" in arm):
        notes.append("incomplete")
    if arm.get("within_noise"):
        needed = arm.get("seeds_to_resolve")
        notes.append("within noise" + (f": ~{needed} seeds would resolve it" if needed else ""))
    return notes


def _figure_row(label: str, figures: dict, reference_final: bool = True) -> dict[str, str]:
    measured = "final_val_loss_difference" in figures
    return {
        "arm": label,
        "delta": (_number(figures.get("final_val_loss_difference")) + " "
                  + _interval(figures.get("final_val_loss_difference_interval"))) if measured else "–",
        "resolvable": _number(figures.get("resolvable_difference")) if measured else "–",
        "tokens": _tokens(figures.get("tokens_to_target")) if measured else "–",
        "speedup": (("≥ " if figures.get("speedup_is_lower_bound") else "") + _number(figures.get("speedup"), 2)
                    + " " + _interval(figures.get("speedup_interval"), 2))
        if measured and figures.get("speedup") is not None else ("not reached" if measured else "–"),
        "time": _number(figures.get("time_speedup"), 2),
    }


def result_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for name, arm in summary["arms"].items():
        row = _figure_row(name + (" (baseline)" if name == summary["baseline"] else ""), arm)
        if name == summary["baseline"] and "final_val_loss_difference" in arm:
            row.update(delta="–", resolvable="–")  # against itself: nothing to resolve
        row.update({
            "best": arm.get("best_label") or "–",
            "final": _number(arm.get("final_val_loss")) + " " + _interval(arm.get("final_val_loss_interval")),
            "spt": "–" if arm.get("seconds_per_token") is None else f"{arm['seconds_per_token'] * 1e6:.1f}",
            "notes": "; ".join(_notes(name, arm)),
        })  # fmt: skip
        rows.append(row)
    return rows


def pair_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for pair in summary.get("pairs", []):
        row = _figure_row(f"{pair['arm']} vs {pair['reference']}", pair)
        row["notes"] = "; ".join(_notes(pair["arm"], pair)) if "final_val_loss_difference" in pair else "incomplete"
        rows.append(row)
    return rows


def result_columns(summary: dict[str, Any]) -> list[tuple[str, str]]:
    interval = f"{round(100 * summary['interval']['confidence'])}% t"
    return [
        ("arm", "arm"),
        ("best", "best point"),
        ("final", f"final val loss [{interval}]"),
        ("delta", f"Δ vs baseline [{interval}, paired]"),
        ("resolvable", "resolvable Δ"),
        ("tokens", "tokens to target"),
        ("speedup", f"speed-up (tokens) [{interval}, log]"),
        ("spt", "µs / token"),
        ("time", "speed-up (time)"),
        ("notes", "notes"),
    ]


PAIR_COLUMNS = [("arm", "arm vs reference"), ("delta", "Δ [t, paired]"), ("resolvable", "resolvable Δ"),
                ("speedup", "speed-up (tokens) [t, log]"), ("time", "speed-up (time)"), ("notes", "notes")]  # fmt: skip


def grid_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for name, arm in summary["arms"].items():
        for point in arm["points"]:
            best = point["point"] == arm.get("best_point")
            rows.append({
                "arm": name,
                "point": point["label"] + (" (added past the edge)" if point["added_past_edge"] else ""),
                "loss": _number(point["tuning_val_loss"]) + (" **best**" if best else ""),
                "status": ", ".join(point["statuses"]),
            })  # fmt: skip
    return rows


def markdown(summary: dict[str, Any]) -> str:
    budget = summary["budget"]
    confidence = round(100 * summary["interval"]["confidence"])
    model = budget["model"]
    described = ", ".join(f"{k} {v}" for k, v in model.items() if k != "type")
    parameters = budget.get("parameters")
    size = (f"{parameters:,} parameters, {budget['tokens_per_parameter']:.1f} tokens per parameter; "
            if parameters else "")  # fmt: skip
    final = summary["final_seeds"]
    title = (
        f"# Comparison `{summary['comparison']}`\n\n"
        f"{model.get('type', 'model').removesuffix('Config')} ({described}; {size}trained for "
        f"{budget['num_train_steps']} steps of {budget['tokens_per_step']:,} tokens ({budget['tokens_per_run'] / 1e6:.3f}M "
        f"tokens per run), evaluated every {budget['steps_per_eval']} steps; tuned on seeds {summary['tuning_seeds']}, "
        f"figures from the final seeds {final} alone; {summary['where']}, {summary['parallel']} run(s) at a time.\n\n"
        f"Target: the baseline ({summary['baseline']}) at its best point, mean final val loss on the final seeds "
        f"**{_number(summary['target_val_loss'])}**. Intervals: {confidence}% Student t over the {len(final)} final "
        f"seeds (n - 1 = {len(final) - 1} degrees of freedom), paired by seed against the baseline; the speed-up's on "
        "the log scale. Resolvable Δ: the difference interval's half-width, the smallest difference these seeds tell "
        "from noise.\n"
    )
    if not summary["complete"]:
        title += f"\n**Incomplete**: {len(summary['incomplete_runs'])} run(s) missing; rerun the command to finish.\n"
    for problem in summary.get("problems", []):
        title += f"\n**{problem['kind'].replace('_', ' ')}**: {problem['arm']} {problem['run'] or ''}\n"
    parts = [
        title,
        markdown_table(result_rows(summary), result_columns(summary)),
        *([markdown_table(pair_rows(summary), PAIR_COLUMNS, title="Pairs: an arm against another reference arm, "
                                                                  "paired by seed")] if summary.get("pairs") else []),
        markdown_table(grid_rows(summary), [("arm", "arm"), ("point", "grid point"),
                                          ("loss", "mean final val loss (tuning seeds)"), ("status", "runs")],
                     title="Tuning: every grid point on the tuning seeds"),  # fmt: skip
        *([f"Downstream evals ({summary['eval_suite']['suite']}), each arm's best point on every final seed:\n\n"
           + summary["eval_suite"]["table"]] if summary.get("eval_suite") else []),
        "Definitions:\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in summary["definitions"].items()) + "\n",
        f"Made by `{summary['command']}` with {_versions(summary['versions'])}.\n",
    ]
    return "\n".join(parts)


def _versions(versions: dict[str, Optional[str]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v)


def plot(summary: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, speedups, deltas) = plt.subplots(1, 3, figsize=(16, 5), dpi=120,
                                                   gridspec_kw={"width_ratios": [3, 2, 2]})  # fmt: skip
    names = list(summary["arms"])
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for name in names:
        arm = summary["arms"][name]
        if "curve" not in arm:
            continue
        curve = arm["curve"]
        tokens = [t / 1e6 for t in curve["tokens"]]
        curves.fill_between(tokens, curve["min"], curve["max"], color=colors[name], alpha=0.2, linewidth=0)
        curves.plot(tokens, curve["mean"], "o-", color=colors[name], markersize=3, label=f"{name} ({arm['best_label']})")
    if summary["target_val_loss"] is not None:
        curves.axhline(summary["target_val_loss"], color="black", linestyle="--", linewidth=1, label="target")
        _zoom(curves, summary)
    curves.set_xlabel("tokens (millions)")
    curves.set_ylabel("val loss (nats/token)")
    curves.set_title(f"seed mean at each arm's best point; band: min-max over the {len(summary['final_seeds'])} "
                     "final seeds", fontsize=9)  # fmt: skip
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)

    measured = [n for n in names if "speedup" in summary["arms"][n]]
    confidence = round(100 * summary["interval"]["confidence"])
    _intervals(speedups, measured, summary, colors, "speedup", "speedup_interval", reference=1.0)
    speedups.set_xlabel(f"speed-up in tokens to the target ({confidence}% t interval)")
    speedups.set_title("> 1: reaches the baseline's final loss sooner", fontsize=9)
    _intervals(deltas, measured, summary, colors, "final_val_loss_difference", "final_val_loss_difference_interval",
               reference=0.0)  # fmt: skip
    deltas.set_xlabel(f"final val loss - the baseline's ({confidence}% paired t interval)")
    deltas.set_title("< 0: ends lower", fontsize=9)
    fig.suptitle(f"{summary['comparison']}: {summary['budget']['tokens_per_run'] / 1e6:.2f}M tokens per run, "
                 f"final seeds {summary['final_seeds']}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _intervals(axes, names: list[str], summary: dict[str, Any], colors: dict[str, str], key: str, interval_key: str,
               reference: float) -> None:  # fmt: skip
    """One row per arm: the value, its interval as a bar (an open lower end where it was never reached)."""
    for row, name in enumerate(names):
        arm = summary["arms"][name]
        value = arm.get(key)
        low, high = arm.get(interval_key) or (None, None)
        if value is None:
            axes.plot([reference], [row], "x", color=colors[name])
            axes.annotate("not reached within the run", (reference, row), fontsize=8, va="center", ha="left",
                          xytext=(6, 0), textcoords="offset points")  # fmt: skip
            continue
        left = value if low is None else low
        axes.errorbar([value], [row], xerr=[[value - left], [(value if high is None else high) - value]], fmt="o",
                      color=colors[name], capsize=4)  # fmt: skip
        if low is None:
            axes.annotate("lower end: not reached", (value, row), fontsize=7, va="bottom", xytext=(0, 5),
                          textcoords="offset points")  # fmt: skip
    axes.axvline(reference, color="black", linewidth=1)
    axes.set_yticks(range(len(names)), names)
    axes.set_ylim(-0.5, len(names) - 0.5)
    axes.grid(alpha=0.3, axis="x")


def _zoom(axes, summary: dict[str, Any]) -> None:
    """The first evaluations are far above the rest: show the part of the curves where the arms differ."""
    finals = [a["final_val_loss"] for a in summary["arms"].values() if a.get("final_val_loss") is not None]
    highs = [m for a in summary["arms"].values() if "curve" in a for m in a["curve"]["max"][len(a["curve"]["max"]) // 4:]]
    if finals and highs:
        low, high = min(finals), max(highs)
        margin = 0.05 * (high - low) if high > low else 0.1
        axes.set_ylim(low - margin, high + margin)
