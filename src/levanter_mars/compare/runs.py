"""A comparison's runs as ordinary training runs: each one's config, where it writes, and what it left.

A run is ``python -m levanter_mars.main.train_lm`` on ``<output_dir>/configs/<run id>.yaml`` (plus the comparison's
overrides); its metrics land in ``<output_dir>/runs/<run id>/`` and its checkpoints under the checkpoint base path
(``<output_dir>/checkpoints`` unless the base config's is a bucket). When it ends, the comparison writes
``<output_dir>/records/<run id>.json``: how it ended and a digest of its config, so that a rerun reuses it only if it
would train the very same run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

import fsspec
import yaml

from levanter_mars.compare.measure import Curve
from levanter_mars.compare.plan import Outcome, RunKey, run_id
from levanter_mars.compare.execute import shipped_path
from levanter_mars.compare.spec import ARM_FIELDS, SCHEDULE_FIELDS, CompareConfig, SpecError
from levanter_mars.training.errors import ExitCode
from levanter_mars.training.run.metrics import METRICS_FILENAME, read_metrics
from levanter_mars.training.run.record_copy import record_url
from levanter_mars.training.whole_files import write_whole
from levanter_mars.training.yaml_sections import deep_merge


@dataclass(frozen=True)
class Layout:
    """Where a comparison's files go."""

    output_dir: str
    checkpoint_base: str

    @classmethod
    def of(cls, spec: CompareConfig, base: Mapping[str, Any]) -> "Layout":
        base_path = str(base.get("trainer", {}).get("checkpointer", {}).get("base_path", ""))
        remote = "://" in base_path
        return cls(spec.output_dir, base_path if remote else os.path.join(spec.output_dir, "checkpoints"))

    def path(self, *parts: str) -> str:
        return os.path.join(self.output_dir, *parts)

    def config_path(self, rid: str) -> str:
        return self.path("configs", f"{rid}.yaml")

    def record_path(self, rid: str) -> str:
        return self.path("records", f"{rid}.json")

    def log_path(self, rid: str) -> str:
        return self.path("logs", f"{rid}.log")

    def metrics_path(self, rid: str) -> str:
        return self.path("runs", rid, METRICS_FILENAME)

    def copied_metrics_url(self, rid: str) -> str:
        """Where the run's metrics are copied beside its checkpoints when it ends (``training/run/record_copy``)."""
        return record_url(f"{self.checkpoint_base.rstrip('/')}/{rid}", METRICS_FILENAME)


def run_config(spec: CompareConfig, base: Mapping[str, Any], layout: Layout, key: RunKey) -> dict[str, Any]:
    """The training config of one run: the base (with the spec's overrides), the arm's optimizer with the point's
    values and the base's schedule shape, the seed, the run id, and every path in the comparison's directory (on a
    slice, the run's log directory relative to the working directory the launcher ships)."""
    config = deep_merge(base, spec.base_overrides)
    config["optimizer"] = {**arm_optimizer(spec, config.get("optimizer", {}), key.arm), **dict(key.point)}
    rid = run_id(spec, key)
    remote = spec.tpu_type is not None and spec.tpu_type != "cpu"
    log_dir = shipped_path(layout.path("runs")) if remote else layout.path("runs")
    config = deep_merge(config, {"trainer": {"id": rid, "seed": key.seed, "log_dir": log_dir,
                                             "checkpointer": {"base_path": layout.checkpoint_base}}})  # fmt: skip
    config.pop("data_seed", None)  # the seed decides the data order, for every arm alike
    config["fresh"] = False
    return config


def arm_optimizer(spec: CompareConfig, base_optimizer: Mapping[str, Any], arm_name: str) -> dict[str, Any]:
    """An arm's optimizer section before its grid point: the base's schedule shape, the arm's own fields, and the base's
    other fields as ``spec.base_optimizer_fields`` says (refused unless dropped or kept)."""
    arm = spec.arm(arm_name)
    schedule = {k: v for k, v in base_optimizer.items() if k in SCHEDULE_FIELDS}
    others = {k: v for k, v in base_optimizer.items() if k not in SCHEDULE_FIELDS and k not in ARM_FIELDS}
    if others and spec.base_optimizer_fields == "refuse":
        raise SpecError(
            f"base: optimizer.{next(iter(sorted(others)))}: the base config's optimizer sets {sorted(others)}, which "
            "are neither the schedule's shape nor the arms' type and learning rate; say what they do: "
            "base_optimizer_fields: drop (each arm's optimizer is what the arm says) or keep (every arm's default)"
        )
    kept = others if spec.base_optimizer_fields == "keep" else {}
    if kept:
        from levanter.optim import OptimizerConfig

        import levanter_mars.optim.levanter_config  # noqa: F401  (the mars-* types)

        fields = {f.name for f in dataclasses.fields(OptimizerConfig.get_choice_class(arm.optimizer["type"]))}
        lacking = sorted(set(kept) - fields)
        if lacking:
            raise SpecError(f"base: optimizer.{lacking[0]}: base_optimizer_fields: keep, and arm {arm.name}'s "
                            f"optimizer ({arm.optimizer['type']}) has no {lacking[0]}")  # fmt: skip
    return {**kept, **arm.optimizer, **schedule}


def config_digest(config: Mapping[str, Any], overrides: Sequence[str]) -> str:
    """What the run trains, without where it writes: equal digests, equal runs."""
    trainer = {k: v for k, v in config.get("trainer", {}).items() if k not in ("log_dir", "checkpointer")}
    checkpointer = {k: v for k, v in config.get("trainer", {}).get("checkpointer", {}).items() if k != "base_path"}
    content = {**config, "trainer": {**trainer, "checkpointer": checkpointer}, "overrides": list(overrides)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    arm: str
    point: dict[str, Any]
    seed: int
    status: str
    """``ok``, ``diverged`` (a non-finite stop, exit 3, or a non-finite eval loss), ``data_exhausted`` (exit 4: the
    data ran out before the budget; the same every time, so not retried), ``failed`` (retried by the next invocation),
    ``config_error`` or ``live_elsewhere`` (its lease is held by another launch)."""
    exit_code: Optional[int]
    config_digest: str
    seconds: Optional[float]
    """Wall seconds of the process that ended the run (its start-up and compilation included)."""
    where: str
    """``local``, or the launcher's slice (``cpu x 2 hosts``, ``v4-32``)."""
    log: str
    trained_by: Optional[str] = None
    """The levanter-mars commit that ran it (``git describe``-style short id; None where unknown)."""

    def outcome(self, final_loss: Optional[float]) -> Outcome:
        return Outcome(self.status, final_loss)


def write_record(layout: Layout, record: RunRecord) -> None:
    write_whole(layout.record_path(record.run_id), json.dumps(asdict(record), indent=1, sort_keys=True) + "\n")


def read_record(layout: Layout, rid: str) -> Optional[RunRecord]:
    try:
        with open(layout.record_path(rid)) as f:
            return RunRecord(**json.load(f))
    except FileNotFoundError:
        return None


def check_reusable(record: RunRecord, digest: str, layout: Layout) -> None:
    if record.config_digest != digest:
        raise SpecError(
            f"{layout.record_path(record.run_id)}: run {record.run_id} was trained with another config than this "
            "spec gives it now (arm, grid, base or overrides changed under the same name): use another --output_dir, "
            "or rename the arm"
        )


@dataclass(frozen=True)
class RunResult:
    """What a run left: its eval curve and seconds per training token."""

    curve: Curve
    steps: int
    seconds_per_token: Optional[float]


#: A run's own decided codes and what the comparison records for them (a crash, a kill or a lost host: ``failed``).
DECIDED = {ExitCode.NONFINITE_STOP: "diverged", ExitCode.CONFIG_ERROR: "config_error",
           ExitCode.DATA_EXHAUSTED: "data_exhausted", ExitCode.LIVE_ELSEWHERE: "live_elsewhere"}  # fmt: skip


def status_of(exit_code: Optional[int], result: Optional[RunResult], num_train_steps: int) -> str:
    """How a run ended, from its exit code and its metrics."""
    if exit_code in DECIDED:
        return DECIDED[exit_code]
    if exit_code != 0 or result is None or result.steps < num_train_steps or not result.curve.losses:
        return "failed"
    return "diverged" if any(v is None for v in result.curve.losses) else "ok"


def read_result(layout: Layout, rid: str, tokens_per_step: int, remote: bool) -> Optional[RunResult]:
    """A run's metrics, from its run directory, or from the copy beside its checkpoints (``remote``: runs on other
    machines, whose run directory is on their host 0)."""
    records = _metrics(layout.copied_metrics_url(rid)) if remote else read_metrics(layout.metrics_path(rid))
    if not records:
        return None
    evals = [(int(r["step"]) + 1, _finite(r["eval/loss"])) for r in records if "eval/loss" in r]
    steps = max(int(r["step"]) + 1 for r in records)
    durations = [float(r["throughput/duration"]) for r in records if "throughput/duration" in r]
    # The first steps compile and warm up; what is left is the run's steady pace.
    steady = durations[3:] if len(durations) > 6 else durations
    seconds_per_token = statistics.median(steady) / tokens_per_step if steady else None
    curve = Curve(tuple(float(s * tokens_per_step) for s, _ in evals), tuple(v for _, v in evals))
    return RunResult(curve, steps, seconds_per_token)


def _finite(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _metrics(url: str) -> list[dict[str, Any]]:
    try:
        with fsspec.open(url, "r") as f:
            lines = f.read().splitlines(True)
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.endswith("\n")]


def write_config(layout: Layout, rid: str, config: Mapping[str, Any]) -> str:
    path = layout.config_path(rid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = yaml.safe_dump(dict(config), sort_keys=False)
    if not os.path.exists(path) or open(path).read() != text:
        write_whole(path, text)
    return path
