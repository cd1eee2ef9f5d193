"""Quality per step: learning-rate sweeps driven through the training CLI, and what to read off their eval curves.

Every run is one ``python -m levanter_mars.main.train_lm`` process on a config written from a base YAML, so the
benchmark measures the product (data pipeline, schedules, ``MarsTrainer``, exact objective), not a re-implementation.
A run already complete in the work directory is read back rather than redone, so a sweep can be stopped and resumed.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

from levanter_mars.training.data import pydocs_corpus
from levanter_mars.training.run.metrics import METRICS_FILENAME, read_metrics


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer of the sweep: its config section (without ``learning_rate``) and its learning-rate grid."""

    name: str
    optimizer: Mapping[str, Any]
    learning_rates: tuple[float, ...]


# Each grid spans 9x in steps of 3x around the optimizer's usual learning rate: Lion's steps are sign-sized, so it
# takes about 10x less than AdamW; MARS-Shampoo's Newton-Schulz direction has unit spectral norm, so its entries are
# about 1/sqrt(width) and it takes a larger one. AdamW and MARS-AdamW share a grid.
ADAMW_GRID = (2e-3, 6e-3, 1.8e-2)
SWEEP: tuple[OptimizerSpec, ...] = (
    OptimizerSpec(
        "adamw",
        {"type": "adam", "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "max_grad_norm": 1.0},
        ADAMW_GRID,
    ),
    OptimizerSpec("mars-adamw", {"type": "mars-adamw"}, ADAMW_GRID),
    OptimizerSpec("mars-adamw-exact", {"type": "mars-adamw", "exact": True}, ADAMW_GRID),
    OptimizerSpec("mars-lion", {"type": "mars-lion"}, (2e-4, 6e-4, 1.8e-3)),
    OptimizerSpec("mars-shampoo", {"type": "mars-shampoo"}, (6e-3, 1.8e-2, 5.4e-2)),
    # MARS-M scales its Newton-Schulz direction to AdamW's RMS, so it shares AdamW's learning rate and grid.
    OptimizerSpec("mars-m", {"type": "mars-m"}, ADAMW_GRID),
    OptimizerSpec("mars-m-efficient", {"type": "mars-m", "efficient": True}, ADAMW_GRID),
    # The Muon baseline: MARS-M-efficient with gamma = 0 is Moonlight's Muon without Nesterov (NS5 of the plain
    # momentum, the same 0.2 sqrt(max(rows, cols)) scale, AdamW for embeddings and 1-D tensors), and its state.
    OptimizerSpec("muon", {"type": "mars-m", "efficient": True, "gamma": 0.0}, ADAMW_GRID),
)
BASELINE = "adamw"
MAIN_CONTENDER = "mars-adamw"


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied; nested mappings merge, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def run_id(optimizer: str, learning_rate: float, seed: int) -> str:
    return f"{optimizer}-lr{learning_rate:g}-s{seed}"


def run_config(
    base: Mapping[str, Any],
    spec: OptimizerSpec,
    learning_rate: float,
    seed: int,
    workdir: Path,
    overrides: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """The config of one run: ``base`` with this optimizer, learning rate and seed, and every path in ``workdir``."""
    # The optimizer section is replaced whole: its fields depend on its type. Warmup and schedule come from base.
    schedule = {k: v for k, v in base.get("optimizer", {}).items() if k in ("warmup", "min_lr_ratio", "lr_schedule")}
    config = deep_merge(base, pydocs_corpus.config_section(workdir / "pydocs"))
    config = deep_merge(
        config,
        {
            "trainer": {
                "id": run_id(spec.name, learning_rate, seed),
                "seed": seed,
                "log_dir": str(workdir / "runs"),
                "checkpointer": {"base_path": str(workdir / "checkpoints")},
            },
        },
    )
    config = deep_merge(config, overrides or {})
    config["optimizer"] = {**spec.optimizer, **schedule, "learning_rate": learning_rate}
    return config


def prepare_corpus(base: Mapping[str, Any], workdir: Path, overrides: Optional[Mapping[str, Any]] = None) -> None:
    """Builds the embedded corpus and its token caches for the runs of ``workdir``, once, so that parallel runs
    only read them."""
    from levanter_mars.training.data import cache_check
    from levanter_mars.training.data import sources as data_lib
    from levanter_mars.program_config import parse_train_config

    config = run_config(base, SWEEP[0], SWEEP[0].learning_rates[0], 0, workdir, overrides)
    path = workdir / "configs" / "corpus.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    parsed = parse_train_config(["--config_path", str(path)])
    pydocs_corpus.prepare(parsed.embedded_corpus)
    cache_check.check_and_prepare(parsed.data)  # the runs then find caches with a provenance record
    data_lib.build_local_caches(parsed.data)


@dataclasses.dataclass
class RunResult:
    optimizer: str
    learning_rate: float
    seed: int
    run_id: str
    steps: int
    eval_steps: list[int]
    """Updates done at each evaluation (a record's ``step`` is the index of the update just taken, so ``+1``)."""
    eval_losses: list[Optional[float]]
    final_train_loss: Optional[float]
    seconds: Optional[float]
    """Wall time of the process that finished the run (None when read back from an earlier sweep)."""
    status: str
    """``ok``, ``diverged`` (a non-finite eval loss) or ``failed`` (the process failed: see ``log``)."""
    log: str

    @property
    def final_eval_loss(self) -> Optional[float]:
        return self.eval_losses[-1] if self.eval_losses and self.status == "ok" else None


def _finite_float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and value == value and abs(value) != float("inf") else None


def read_run(metrics_path: Path) -> tuple[int, list[int], list[Optional[float]], Optional[float]]:
    """(updates done, eval steps, eval losses, last train loss) from a run's ``metrics.jsonl``."""
    records = read_metrics(metrics_path)
    eval_points = [(int(r["step"]) + 1, _finite_float(r["eval/loss"])) for r in records if "eval/loss" in r]
    train = [_finite_float(r["train/loss"]) for r in records if "train/loss" in r]
    steps = max((int(r["step"]) + 1 for r in records), default=0)
    return steps, [s for s, _ in eval_points], [v for _, v in eval_points], (train[-1] if train else None)


def train_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "levanter_mars.main.train_lm", "--config_path", str(config_path)]


def run_one(
    config: Mapping[str, Any],
    spec: OptimizerSpec,
    learning_rate: float,
    seed: int,
    workdir: Path,
    timeout: float,
    train: bool = True,
) -> Optional[RunResult]:
    """Trains one run through the CLI, or reads it back if it is already complete. With ``train=False`` an
    incomplete run is not started and None is returned."""
    rid = config["trainer"]["id"]
    num_steps = int(config["trainer"]["num_train_steps"])
    metrics_path = workdir / "runs" / rid / METRICS_FILENAME
    log_path = workdir / "logs" / f"{rid}.log"
    seconds = None
    status = "ok"
    complete = read_run(metrics_path)[0] >= num_steps
    if not complete and not train:
        return None
    if not complete:
        config_path = workdir / "configs" / f"{rid}.yaml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        start = time.perf_counter()
        with log_path.open("w") as log:
            try:
                proc = subprocess.run(
                    train_command(config_path), stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=os.environ
                )
                returncode = proc.returncode
            except subprocess.TimeoutExpired:
                returncode = "timeout"
        seconds = time.perf_counter() - start
        if returncode != 0:
            status = "failed"
    steps, eval_steps, eval_losses, final_train = read_run(metrics_path)
    if status == "ok" and (steps < num_steps or not eval_losses):
        status = "failed"
    if status == "ok" and any(v is None for v in eval_losses):
        status = "diverged"
    return RunResult(
        spec.name, learning_rate, seed, rid, steps, eval_steps, eval_losses, final_train, seconds, status, str(log_path)
    )


def steps_to_reach(steps: Sequence[int], losses: Sequence[Optional[float]], target: float) -> Optional[float]:
    """First point where the curve reaches ``target``, linearly interpolated between eval points; None if never."""
    previous = None
    for step, loss in zip(steps, losses):
        if loss is None:
            return None
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(step)
            (s0, l0) = previous
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        previous = (step, loss)
    return None


def mean_curve(runs: Sequence[RunResult]) -> tuple[list[int], list[Optional[float]]]:
    """The seed-mean eval curve of runs that share their eval steps (None wherever a seed is missing a value)."""
    steps = runs[0].eval_steps
    if any(r.eval_steps != steps for r in runs):
        raise ValueError(f"runs {[r.run_id for r in runs]} were evaluated at different steps")
    losses: list[Optional[float]] = []
    for i in range(len(steps)):
        values = [r.eval_losses[i] for r in runs]
        losses.append(None if any(v is None for v in values) else statistics.fmean(values))
    return steps, losses


def summarize(results: Sequence[RunResult], specs: Sequence[OptimizerSpec] = SWEEP) -> dict[str, Any]:
    """Per optimizer: final val loss per learning rate (mean over seeds), the best learning rate, and the steps its
    seed-mean curve needs to reach tuned AdamW's final val loss, as a ratio of the steps AdamW's own curve needs."""
    by_optimizer: dict[str, Any] = {}
    for spec in specs:
        per_lr = []
        for lr in spec.learning_rates:
            runs = [r for r in results if r.optimizer == spec.name and r.learning_rate == lr]
            finals = [r.final_eval_loss for r in runs]
            complete = bool(runs) and all(f is not None for f in finals)
            per_lr.append(
                {
                    "learning_rate": lr,
                    "seeds": [r.seed for r in runs],
                    "final_val_losses": finals,
                    "mean_final_val_loss": statistics.fmean(finals) if complete else None,
                    "statuses": [r.status for r in runs],
                }
            )
        scored = [p for p in per_lr if p["mean_final_val_loss"] is not None]
        best = min(scored, key=lambda p: p["mean_final_val_loss"]) if scored else None
        by_optimizer[spec.name] = {
            "per_learning_rate": per_lr,
            "best_learning_rate": best["learning_rate"] if best else None,
            "best_final_val_loss": best["mean_final_val_loss"] if best else None,
            "best_lr_at_grid_edge": bool(best) and best["learning_rate"] in (min(spec.learning_rates), max(spec.learning_rates)),
        }

    baseline = by_optimizer.get(BASELINE, {})
    target = baseline.get("best_final_val_loss")
    for name in sorted(by_optimizer, key=lambda n: n != BASELINE):  # the baseline first: the ratios need its steps
        entry = by_optimizer[name]
        entry["steps_to_target"] = None
        entry["steps_ratio"] = None
        if target is None or entry["best_learning_rate"] is None:
            continue
        runs = [r for r in results if r.optimizer == name and r.learning_rate == entry["best_learning_rate"]]
        steps, losses = mean_curve(runs)
        entry["curve_steps"], entry["curve_mean_val_loss"] = steps, losses
        reached = steps_to_reach(steps, losses, target)
        entry["steps_to_target"] = reached
        baseline_steps = baseline.get("steps_to_target")
        entry["steps_ratio"] = None if reached is None or not baseline_steps else reached / baseline_steps
    return {"target_val_loss": target, "optimizers": by_optimizer}
