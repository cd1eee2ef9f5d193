"""The goodput record in words (the run summary) and as a timeline (``goodput.png``, beside ``loss_curve.png``)."""

from __future__ import annotations

import os

from levanter_mars.training.run.goodput.arithmetic import epoch
from levanter_mars.training.run.goodput.clock import CATEGORIES

#: One colour per category, the same in every figure.
COLOURS = {"startup": "#9e9e9e", "compile": "#ff9800", "train": "#4caf50", "checkpoint": "#2196f3",
           "eval": "#9c27b0", "lost": "#f44336"}  # fmt: skip


def describe(data: dict) -> list[str]:
    """Summary lines: the goodput, then one line per attempt, then the evaluations that failed."""
    attempts = data.get("attempts") or []
    if not attempts:
        return []
    lines = [f"  goodput:     {data.get('goodput')} (productive {data.get('productive_seconds', 0):.1f} s of "
             f"{data.get('wall_seconds', 0):.1f} s wall, {len(attempts)} attempt(s))"]  # fmt: skip
    multislice = any(entry.get("slices", 1) != 1 for entry in attempts)
    for number, entry in enumerate(attempts, 1):
        seconds = entry["seconds"]
        split = ", ".join(f"{k} {seconds.get(k, 0):.1f}" for k in CATEGORIES)
        code = entry.get("exit_code")
        steps = f"steps {entry.get('first_step')}..{entry.get('last_step')}"
        on = f" on {entry['slices']} slice(s)" if multislice and "slices" in entry else ""
        lines.append(f"    {number}. {_origin(entry)}{on}: {steps}, "
                     f"{'exit ' + str(code) if code is not None else 'no exit recorded'}{_how_it_ended(entry)}; "
                     f"{split} s")  # fmt: skip
        detail = {k: v for k, v in (entry.get("lost_detail") or {}).items() if v}
        if detail:
            lines.append("       lost: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in detail.items()))
        if entry.get("slice_change"):
            lines.append(f"       slices changed: {entry['slice_change']}")
    failures = [(f, number) for number, e in enumerate(attempts, 1) for f in e.get("eval_failures") or []]
    for failure, number in failures:
        lines.append(f"  eval failed at step {failure['step']} (attempt {number}): {failure['task']}: "
                     f"{failure['reason'][:200]}")  # fmt: skip
    return lines


def _how_it_ended(entry: dict) -> str:
    """`` (preempted, saved at step 17 in 0.4 s; the next attempt redid 0 steps)``, where the record says."""
    said = []
    preemption = entry.get("preemption")
    if preemption is not None:
        said.append(f"{entry.get('ended_as')} in {preemption.get('save_seconds')} s")
    if entry.get("steps_redone_next") is not None:
        said.append(f"the next attempt redid {entry['steps_redone_next']} step(s)")
    return f" ({'; '.join(said)})" if said else ""


def _origin(entry: dict) -> str:
    launch = entry.get("launch_id")
    return f"launch {launch}, its attempt {entry.get('attempt')}" if launch else "a plain command"


def plot_goodput(data: dict, output_png: str | os.PathLike) -> str:
    """Each attempt a bar on a time axis (seconds since the run's first start), cut into its categories in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    attempts = data["attempts"]
    origin = min(epoch(a["started"]) for a in attempts)
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.6 * len(attempts)), dpi=120)
    for row, entry in enumerate(attempts):
        start = epoch(entry["started"]) - origin
        between = float((entry.get("lost_detail") or {}).get("between_attempts", 0.0))
        if between > 0:  # the launch's time before this attempt started: drawn where it fell
            ax.broken_barh([(start - between, between)], (row - 0.35, 0.7), color=COLOURS["lost"], alpha=0.5)
        for category in CATEGORIES:
            width = float(entry["seconds"].get(category, 0.0)) - (between if category == "lost" else 0.0)
            if width > 0:
                ax.broken_barh([(start, width)], (row - 0.35, 0.7), color=COLOURS[category])
                start += width
        code = entry.get("exit_code")
        ax.text(start, row, f"  {'exit ' + str(code) if code is not None else 'no exit recorded'}", va="center",
                fontsize=8)  # fmt: skip
    ax.set_yticks(range(len(attempts)), [f"attempt {i}" for i in range(1, len(attempts) + 1)])
    ax.set_ylim(len(attempts) - 0.5, -0.5)
    ax.set_xlabel("seconds since the first attempt started")
    ax.set_title(f"goodput {data.get('goodput')}: {data.get('productive_seconds', 0):.0f} s productive of "
                 f"{data.get('wall_seconds', 0):.0f} s")  # fmt: skip
    handles = [Patch(color=COLOURS[c], label=c) for c in CATEGORIES]
    fig.legend(handles=handles, ncol=len(CATEGORIES), fontsize=7, loc="lower center")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(output_png)
    plt.close(fig)
    return str(output_png)
