"""Bad comparison specs get one clear line naming the field, exit 2, before any run starts (nothing trained, no run
directory): the spec's own shape, and each run's training config through the training program's own parser and
validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from levanter_mars.compare.spec import parse
from levanter_mars.main.compare import cli
from levanter_mars.training.data.pydocs_corpus import config_section
from levanter_mars.training.yaml_sections import deep_merge
from tests.helpers.training import TINY_CONFIG

ADAMW = {"name": "adamw", "optimizer": {"type": "adam"}, "grid": {"learning_rate": [1e-3, 3e-3]}}
MARS = {"name": "mars", "optimizer": {"type": "mars-adamw"}, "grid": {"learning_rate": [1e-3]}}


@pytest.fixture
def write_spec(tmp_path, pydocs_corpus):
    base = deep_merge(yaml.safe_load(TINY_CONFIG.read_text()), config_section(pydocs_corpus))
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))

    def write(**changes) -> Path:
        spec = {"name": "bad", "base": "base.yaml", "baseline": "adamw", "arms": [ADAMW, MARS], "final_seeds": [1, 2],
                "output_dir": str(tmp_path / "out")}  # fmt: skip
        spec.update(changes)
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


def refused(capsys, path: Path, *extra: str) -> str:
    code = cli(["--config_path", str(path), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("config error:")]
    assert len(lines) == 1, err
    assert not (path.parent / "out" / "runs").exists() and not (path.parent / "out" / "records").exists()
    return lines[0]


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"baseline": "sgd"}, "baseline: 'sgd' is not an arm"),
        ({"arms": [ADAMW, {**MARS, "grid": {"learning_rate": []}}]}, "arms[1].grid.learning_rate: an empty grid"),
        ({"arms": [{**ADAMW, "grid": {"learning_rate": [1e-3]}}, MARS]},
         "arms[0].grid.learning_rate: the baseline (adamw) is tuned"),
        ({"arms": [ADAMW, {**MARS, "optimizer": {"type": "mars-adamw", "warmup": 0.2}}]},
         "arms[1].optimizer.warmup: the schedule's shape"),
        ({"arms": [ADAMW, {**MARS, "optimizer": {"beta1": 0.9}}]}, "arms[1].optimizer.type is required"),
        ({"arms": [ADAMW, ADAMW]}, "arms: names must differ"),
        ({"tuning": {"seeds": [1]}}, "final_seeds and tuning.seeds must be disjoint, and [1] is in both"),
        ({"final_seeds": [3]}, "final_seeds: at least 2 seeds (an interval needs a spread)"),
        ({"seeds": [0, 1, 2]}, "seeds: this field is gone; use final_seeds (the seeds of the figures) and "
                               "tuning.seeds (default [0]), disjoint"),
        ({"interval": {"samples": 100}}, "interval.samples: this field is gone"),
        ({"pairs": [["mars", "sgd"]]}, "pairs[0]: two different arms [arm, reference]"),
        ({"base_optimizer_fields": "merge"}, "base_optimizer_fields must be one of ('refuse', 'drop', 'keep')"),
        ({"arms": [ADAMW, {**MARS, "grid": {"learning_rate": ["fast"]}}]},
         "arms[1] (mars) at lrfast: the run's training config is bad"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(capsys, write_spec, changes, expected):
    assert expected in refused(capsys, write_spec(**changes))


def test_an_unknown_arm_optimizer_is_refused_naming_the_arm_and_field(capsys, write_spec):
    line = refused(capsys, write_spec(arms=[ADAMW, {**MARS, "optimizer": {"type": "mars-sgd"}}]))
    assert "arms[1] (mars) at lr0.001" in line and "mars-sgd" in line, line


def test_a_bad_arm_field_is_refused_by_the_optimizers_own_checks(capsys, write_spec):
    line = refused(capsys, write_spec(arms=[ADAMW, {**MARS, "grid": {"learning_rate": [1e-3], "beta1": [1.5]}}]))
    assert "arms[1] (mars)" in line and "optimizer.beta1" in line, line


def test_a_base_config_that_does_not_validate_is_refused_before_any_run(capsys, write_spec):
    line = refused(capsys, write_spec(base_overrides={"model": {"hidden_dim": 30, "num_heads": 4}}))
    assert "model.hidden_dim=30 must be a multiple of model.num_heads=4" in line, line


def test_overrides_cannot_change_what_the_comparison_decides(capsys, write_spec):
    line = refused(capsys, write_spec(), "--", "--optimizer.learning_rate", "1")
    assert "override --optimizer.learning_rate" in line, line
    line = refused(capsys, write_spec(), "--", "--trainer.seed", "3")
    assert "override --trainer.seed" in line, line


def test_a_missing_spec_or_base_is_named(capsys, tmp_path, write_spec):
    assert "--config_path: no such file" in refused(capsys, tmp_path / "nope.yaml")
    assert "base: no such file" in refused(capsys, write_spec(base="missing.yaml"))


def _base_with_optimizer_fields(tmp_path, **fields):
    base = yaml.safe_load((tmp_path / "base.yaml").read_text())
    base["optimizer"].update(fields)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))


def test_the_bases_other_optimizer_fields_are_refused_by_name_unless_dropped_or_kept(capsys, tmp_path, write_spec):
    from levanter_mars.compare.comparison import open_comparison
    from levanter_mars.compare.spec import parse

    spec_path = write_spec()
    _base_with_optimizer_fields(tmp_path, weight_decay=0.3, max_grad_norm=0.5)
    line = refused(capsys, spec_path)
    assert "base: optimizer.max_grad_norm: the base config's optimizer sets ['max_grad_norm', 'weight_decay']" in line
    assert "base_optimizer_fields: drop" in line and "or keep" in line

    def first_run_optimizers(policy):
        spec, overrides, _ = parse(["--config_path", str(write_spec(base_optimizer_fields=policy))])
        comparison = open_comparison(spec, overrides)
        return {arm: comparison.arm_optimizer(arm) for arm in ("adamw", "mars")}

    dropped = first_run_optimizers("drop")
    assert dropped["adamw"] == {"type": "adam", "warmup": 0.1, "min_lr_ratio": 0.1}
    kept = first_run_optimizers("keep")
    assert kept["adamw"] == {"weight_decay": 0.3, "max_grad_norm": 0.5, "type": "adam", "warmup": 0.1,
                             "min_lr_ratio": 0.1}  # fmt: skip
    mine = {**MARS, "optimizer": {"type": "mars-adamw", "weight_decay": 0.01}}
    spec, overrides, _ = parse(["--config_path", str(write_spec(base_optimizer_fields="keep", arms=[ADAMW, mine]))])
    assert open_comparison(spec, overrides).arm_optimizer("mars")["weight_decay"] == 0.01  # the arm's own wins
    _base_with_optimizer_fields(tmp_path, nesterov=True)  # an adam field mars-adamw lacks
    line = refused(capsys, write_spec(base_optimizer_fields="keep"))
    assert "base: optimizer.nesterov: base_optimizer_fields: keep, and arm mars's optimizer (mars-adamw) has no " \
           "nesterov" in line, line  # fmt: skip


def test_a_run_sent_to_a_pod_writes_its_logs_under_the_shipped_directory_not_this_machines(tmp_path, write_spec,
                                                                                          monkeypatch):  # fmt: skip
    from levanter_mars.compare.tuning import RunKey
    from levanter_mars.compare.layout import Layout
    from levanter_mars.compare.run_configs import run_config
    from levanter_mars.compare.spec import load_base

    monkeypatch.chdir(tmp_path)  # the working directory the launcher ships
    spec, _, _ = parse(["--config_path", str(write_spec()), "--tpu_type", "v4-32"])
    base = load_base(spec.base)
    key = RunKey("adamw", (("learning_rate", 1e-3),), 1)
    config = run_config(spec, base, Layout.of(spec, base), key)
    assert config["trainer"]["log_dir"] == "out/runs"
    local, _, _ = parse(["--config_path", str(write_spec())])
    assert run_config(local, base, Layout.of(local, base), key)["trainer"]["log_dir"] == str(tmp_path / "out" / "runs")
