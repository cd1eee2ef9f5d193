"""A comparison's runs as ordinary training configs: the base with the arm's optimizer, the point, the seed and the
comparison's paths, and a digest of what the config trains, so a rerun reuses a run only if it would train the very
same run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Mapping, Sequence

import yaml

from levanter_mars.compare.execute import shipped_path
from levanter_mars.compare.layout import Layout
from levanter_mars.compare.spec import ARM_FIELDS, SCHEDULE_FIELDS, CompareConfig, SpecError
from levanter_mars.compare.tuning import RunKey, run_id
from levanter_mars.training.whole_files import write_whole
from levanter_mars.training.yaml_sections import deep_merge


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


def write_config(layout: Layout, rid: str, config: Mapping[str, Any]) -> str:
    path = layout.config_path(rid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = yaml.safe_dump(dict(config), sort_keys=False)
    if not os.path.exists(path) or open(path).read() != text:
        write_whole(path, text)
    return path
