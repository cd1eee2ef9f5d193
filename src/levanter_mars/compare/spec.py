"""A comparison spec: which optimizers (arms) to compare on which base training run, how each is tuned, on which
seeds, and where the runs go. YAML, parsed by draccus like the training configs (``config/compare/*.yaml``).

Fairness is the spec's shape, not a convention: an arm names only its optimizer block and the grid of that block's
fields it tunes. Model, data, batch, token budget, evaluation, seeds, and the learning-rate schedule's shape
(warmup, decay, minimum) come from the base config and are the same for every arm.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import draccus
import yaml
from draccus.parsers.yaml_loader import SafeLoaderWithInclusion

from levanter_mars.compat.cli import argparse_errors_raise


class SpecError(ValueError):
    """A bad comparison spec or command line: the message names the field or file."""


#: What the base config's other optimizer fields do (``CompareConfig.base_optimizer_fields``).
BASE_OPTIMIZER_POLICIES = ("refuse", "drop", "keep")
#: Base optimizer fields every arm sets itself: not the base's to keep, refuse or drop.
ARM_FIELDS = ("type", "learning_rate")

#: Optimizer fields that make the learning-rate schedule's shape: the base config's, for every arm.
SCHEDULE_FIELDS = ("warmup", "decay", "rewarmup", "cooldown", "cycle_length", "cycles", "lr_schedule", "haps",
                   "min_lr_ratio")  # fmt: skip


@dataclass(frozen=True)
class ArmConfig:
    name: str
    """A short name (letters, digits, '.', '_', '-'): it names the arm's runs."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """The optimizer section of every run of the arm (``type`` and the fields it fixes), as in a training YAML."""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Optimizer fields to tune, each with its values: every combination is a grid point (``learning_rate`` at least
    for the baseline)."""


@dataclass(frozen=True)
class TuningConfig:
    seeds: list[int] = field(default_factory=lambda: [0])
    """The seeds every grid point is trained on. None of them is a final seed: a figure from a seed the tuning chose
    on would favour the arms with the bigger grids (the winner's curse)."""
    extend_at_edge: int = 0
    """When an arm's best point has the largest or smallest learning rate of its grid, add the next point past that
    edge (the grid's ratio) and tune again, at most this many times per arm. 0: report the edge, extend nothing."""


@dataclass(frozen=True)
class IntervalConfig:
    confidence: float = 0.95
    """Of every interval (Student t over the final seeds, paired where two arms are compared: ``compare.measure``)."""


@dataclass(frozen=True)
class CompareConfig:
    name: str = ""
    """The comparison's name: it names its directory and prefixes every run id."""
    base: str = ""
    """The base training config: model, data, batch, token budget, evaluation, schedule shape. A path relative to
    this spec's directory (or absolute)."""
    base_overrides: dict[str, Any] = field(default_factory=dict)
    """Merged into the base config for every run (sections of a training YAML), e.g. the comparison's own budget."""
    baseline: str = "adamw"
    """The arm every other is measured against; its tuned best point sets the target loss."""
    arms: list[ArmConfig] = field(default_factory=list)
    final_seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """The seeds each arm's best point is trained on: every figure comes from them, none is a tuning seed."""
    tuning: TuningConfig = field(default_factory=TuningConfig)
    interval: IntervalConfig = field(default_factory=IntervalConfig)
    pairs: list[list[str]] = field(default_factory=list)
    """More comparisons, each ``[arm, reference]`` measured like an arm against the baseline (``[mars-m, muon]``: does
    MARS's correction pay over Muon?)."""
    final_runs_may_diverge: bool = False
    """A best point whose final run diverges loses that arm's figures, and the command exits 3 (named in
    compare.md); with true it exits 0. The baseline diverging is an error either way (no target)."""
    base_optimizer_fields: str = "refuse"
    """The base config's optimizer fields besides its type, learning rate and schedule shape: ``refuse`` them (the
    error names them), ``drop`` them (every arm's optimizer is what the arm says) or ``keep`` them as every arm's
    default (an arm's own value wins; a field an arm's optimizer lacks is refused)."""
    eval_suite: Optional[str] = None
    """An eval suite (``config/eval/quick.yaml``) run on each arm's final checkpoints, in one table. Relative paths
    are the spec's, like ``base``."""

    output_dir: Optional[str] = None
    """Where every run and the outputs go (default: ``runs/compare/<name>``). Rerunning with the same directory
    finishes what is missing."""
    parallel: int = 1
    """Runs at a time."""
    run_timeout: Optional[float] = None
    """Seconds before one run's process is stopped (and recorded as failed); None: no limit."""
    tpu_type: Optional[str] = None
    """None: each run is a training process on this machine. A slice type (``v4-32``), or ``cpu`` for the local pod:
    each run goes through the launcher (``python -m levanter_mars.infra.launch``)."""
    num_hosts: int = 1
    """``tpu_type: cpu`` only: hosts of the local pod."""
    devices_per_host: Optional[int] = None
    """``tpu_type: cpu`` only: simulated devices of each host."""
    num_slices: int = 1
    address: Optional[str] = None
    """The Ray cluster's dashboard address for launched runs (see the launcher)."""
    dry_run: bool = False
    """Check every run's config and print the runs planned so far with their commands; run nothing."""

    @property
    def tuning_seeds(self) -> list[int]:
        return list(self.tuning.seeds)

    @property
    def seeds(self) -> list[int]:
        """Every seed of the comparison: the tuning seeds, then the final ones."""
        return [*self.tuning_seeds, *self.final_seeds]

    def arm(self, name: str) -> ArmConfig:
        return next(a for a in self.arms if a.name == name)


_NAME_CHARACTERS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _check_name(value: str, where: str) -> None:
    if not value or not set(value) <= _NAME_CHARACTERS:
        raise SpecError(f"{where} must be a non-empty name of letters, digits, '.', '_' and '-', got {value!r}")


def check(spec: CompareConfig) -> None:
    """What the spec alone decides (each run's training config is checked by the training program's own validation,
    before any run starts: see ``compare.comparison.open_comparison``)."""
    _check_name(spec.name, "name")
    if not spec.base:
        raise SpecError("base: the base training config is required")
    if not spec.arms:
        raise SpecError("arms: at least one arm is required")
    names = [arm.name for arm in spec.arms]
    for i, arm in enumerate(spec.arms):
        _check_arm(arm, f"arms[{i}]")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"arms: names must differ, {duplicates} repeated")
    if spec.baseline not in names:
        raise SpecError(f"baseline: {spec.baseline!r} is not an arm (arms: {names})")
    baseline_rates = spec.arm(spec.baseline).grid.get("learning_rate", [])
    if len(set(baseline_rates)) < 2:
        raise SpecError(
            f"arms[{names.index(spec.baseline)}].grid.learning_rate: the baseline ({spec.baseline}) is tuned on the "
            f"comparison's own budget, so its grid needs at least 2 learning rates, got {baseline_rates}"
        )
    if len(spec.final_seeds) < 2 or len(set(spec.final_seeds)) != len(spec.final_seeds):
        raise SpecError(f"final_seeds: at least 2 seeds (an interval needs a spread), each once, got "
                        f"{spec.final_seeds}")  # fmt: skip
    if not spec.tuning_seeds or len(set(spec.tuning_seeds)) != len(spec.tuning_seeds):
        raise SpecError(f"tuning.seeds: at least one seed, each once, got {spec.tuning_seeds}")
    shared = sorted(set(spec.tuning_seeds) & set(spec.final_seeds))
    if shared:
        raise SpecError(f"final_seeds and tuning.seeds must be disjoint, and {shared} is in both: a figure from a seed "
                        "the tuning chose on favours the arms with bigger grids")  # fmt: skip
    for i, pair in enumerate(spec.pairs):
        if len(pair) != 2 or pair[0] == pair[1] or any(p not in names for p in pair):
            raise SpecError(f"pairs[{i}]: two different arms [arm, reference] of {names}, got {pair}")
    if spec.base_optimizer_fields not in BASE_OPTIMIZER_POLICIES:
        raise SpecError(f"base_optimizer_fields must be one of {BASE_OPTIMIZER_POLICIES}, got "
                        f"{spec.base_optimizer_fields!r}")  # fmt: skip
    if spec.tuning.extend_at_edge < 0:
        raise SpecError(f"tuning.extend_at_edge must be >= 0, got {spec.tuning.extend_at_edge}")
    if not 0 < spec.interval.confidence < 1:
        raise SpecError(f"interval.confidence must be in (0, 1), got {spec.interval.confidence}")
    if spec.parallel < 1:
        raise SpecError(f"parallel must be >= 1, got {spec.parallel}")
    if spec.tpu_type is None and (spec.num_hosts != 1 or spec.devices_per_host is not None or spec.num_slices != 1):
        raise SpecError("num_hosts, devices_per_host and num_slices need tpu_type (cpu: the local pod)")


def _check_arm(arm: ArmConfig, where: str) -> None:
    _check_name(arm.name, f"{where}.name")
    if not arm.optimizer.get("type"):
        raise SpecError(f"{where}.optimizer.type is required (adam, mars-adamw, mars-m, ...)")
    if not arm.grid:
        raise SpecError(f"{where}.grid: at least one field to tune (learning_rate: [...])")
    for key, values in arm.grid.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}.grid.{key}: an empty grid; give at least one value")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"{where}.grid.{key}: a value is repeated in {values}")
        if key in arm.optimizer:
            raise SpecError(f"{where}.grid.{key} is also fixed in {where}.optimizer.{key}: keep one")
    for key in (*arm.optimizer, *arm.grid):
        if key in SCHEDULE_FIELDS:
            section = "optimizer" if key in arm.optimizer else "grid"
            raise SpecError(
                f"{where}.{section}.{key}: the schedule's shape ({', '.join(SCHEDULE_FIELDS)}) is the base config's, "
                "the same for every arm"
            )
    if "learning_rate" in arm.optimizer:
        raise SpecError(f"{where}.optimizer.learning_rate: an arm's learning rate is tuned: put it in {where}.grid")
    if "learning_rate" not in arm.grid:
        raise SpecError(f"{where}.grid.learning_rate is required: every arm tunes its learning rate")


def parse(argv: Sequence[str]) -> tuple[CompareConfig, list[str], str]:
    """``--config_path SPEC [--field value ...] [-- training overrides]``: the spec (paths resolved against its
    file), the overrides for every run, and the spec file's path. Raises :class:`SpecError` naming the field."""
    argv = list(argv)
    overrides: list[str] = []
    if "--" in argv:
        argv, overrides = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    path = _config_path(argv)
    if path is None:
        raise SpecError("--config_path is required: a comparison spec (config/compare/*.yaml)")
    if not os.path.exists(path):
        raise SpecError(f"--config_path: no such file {path!r}")
    _refuse_renamed_fields(path)
    try:
        with argparse_errors_raise(SpecError):
            spec = draccus.parse(CompareConfig, config_path=path, args=_without_config_path(argv))
    except draccus.utils.DecodingError as e:
        where = ".".join(str(p) for p in e.key_path)
        raise SpecError(f"{path}: {where + ': ' if where else ''}{e.message}") from e
    except (draccus.utils.ParsingError, ValueError) as e:
        raise SpecError(f"{path}: {e}") from e
    check(spec)
    _check_overrides(overrides)
    return _resolved(spec, os.path.dirname(os.path.abspath(path))), overrides, path


#: Training fields a comparison sets for each run: an override of one would break the comparison's design.
_OWN_FIELDS = ("--optimizer.", "--trainer.seed", "--trainer.id", "--trainer.log_dir", "--data_seed", "--fresh",
               "--config_path", "--config")


def _check_overrides(overrides: Sequence[str]) -> None:
    for arg in overrides:
        if any(arg == own.rstrip(".") or arg.startswith(own) for own in _OWN_FIELDS):
            raise SpecError(
                f"override {arg}: the comparison sets the config, optimizer, seed and run id of every run (use the "
                "spec's base, arms, seeds and name)"
            )


#: Fields an earlier spec had: their new names (a spec of before is refused naming them, never read otherwise).
RENAMED = {
    "seeds": "final_seeds (the seeds of the figures) and tuning.seeds (default [0]), disjoint",
    "interval.samples": "nothing: intervals are Student t over the final seeds (compare.measure)",
    "interval.seed": "nothing: intervals are Student t over the final seeds (compare.measure)",
}


def _refuse_renamed_fields(path: str) -> None:
    with open(path) as f:
        try:
            raw = yaml.load(f, Loader=SafeLoaderWithInclusion)
        except yaml.YAMLError:
            return  # draccus names the error
    if not isinstance(raw, dict):
        return
    present = [k for k in RENAMED if (k in raw if "." not in k else k.split(".")[1] in (raw.get("interval") or {}))]
    if present:
        raise SpecError(f"{path}: {present[0]}: this field is gone; use {RENAMED[present[0]]}")


def _config_path(argv: Sequence[str]) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == "--config_path":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("--config_path="):
            return arg.split("=", 1)[1]
    return None


def _without_config_path(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--config_path":
            skip = True
        elif not arg.startswith("--config_path="):
            out.append(arg)
    return out


def _resolved(spec: CompareConfig, spec_dir: str) -> CompareConfig:
    import dataclasses

    def resolve(path: Optional[str]) -> Optional[str]:
        if path is None or "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(spec_dir, path))

    output_dir = spec.output_dir or os.path.join("runs", "compare", spec.name)
    return dataclasses.replace(spec, base=resolve(spec.base), eval_suite=resolve(spec.eval_suite),
                               output_dir=output_dir if "://" in output_dir else os.path.abspath(output_dir))


def load_base(path: str) -> dict[str, Any]:
    """The base training config as a mapping, its ``!include``s resolved (as the training program resolves them)."""
    if not os.path.exists(path):
        raise SpecError(f"base: no such file {path!r}")
    with open(path) as f:
        try:
            config = yaml.load(f, Loader=SafeLoaderWithInclusion)
        except (yaml.YAMLError, OSError) as e:
            raise SpecError(f"base: {path} is not a readable YAML config: {e}") from e
    if not isinstance(config, dict):
        raise SpecError(f"base: {path} is not a mapping of config sections")
    return config
