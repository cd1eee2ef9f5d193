"""Loss curves from metrics.jsonl files."""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from levanter_mars.training.run.metrics import read_metrics


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values, dtype=float)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window <= 1:
        return values
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, values[0]), values])
    return np.convolve(padded, kernel, mode="valid")


def plot_loss_curves(
    runs: Mapping[str, str | os.PathLike],
    output_png: str | os.PathLike,
    *,
    title: str = "",
    train_key: str = "train/loss",
    eval_key: str = "eval/loss",
) -> str:
    """One figure: smoothed train loss (thin) and eval loss (markers) per run, labelled by the mapping's keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for i, (label, path) in enumerate(runs.items()):
        records = read_metrics(path)
        color = f"C{i % 10}"
        steps, train = _series(records, train_key)
        if len(steps):
            window = max(1, len(train) // 50)
            ax.plot(steps, _smooth(train, window), color=color, alpha=0.6, linewidth=1, label=f"{label} train")
        steps, evals = _series(records, eval_key)
        if len(steps):
            ax.plot(steps, evals, "o-", color=color, linewidth=2, markersize=4, label=f"{label} eval")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output_png)
    plt.close(fig)
    return str(output_png)
