"""Bad comparison specs get one clear line naming the field, exit 2, before any run starts (nothing trained, no run
directory): the spec's own shape, and each run's training config through the training program's own parser and
validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
        spec = {"name": "bad", "base": "base.yaml", "baseline": "adamw", "arms": [ADAMW, MARS], "seeds": [0],
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
        ({"tuning": {"seeds": [5]}}, "tuning.seeds must be some of seeds"),
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
