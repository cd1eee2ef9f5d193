"""The comparison's fairness, held on the runs it makes (``compare.run_configs.run_config``), each started by the training
CLI as the comparison starts it and stopped before its first step: at one seed every arm starts from the same initial
parameters, reads the same first batches (token ids) and so has the same initial loss; another seed changes all
three. What an arm sets (its optimizer) is all that differs."""

import json
from pathlib import Path

import pytest
import yaml

from levanter_mars.compare.comparison import open_comparison
from levanter_mars.compare.tuning import RunKey
from levanter_mars.compare.spec import parse
from levanter_mars.training.data.pydocs_corpus import config_section
from levanter_mars.training.yaml_sections import deep_merge
from tests.helpers.faults import prelude
from tests.helpers.training import TINY_CONFIG, cli_arguments
from tests.helpers.processes import run_python

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def starts(tmp_path_factory, pydocs_corpus):
    work = tmp_path_factory.mktemp("fairness")
    base = deep_merge(yaml.safe_load(TINY_CONFIG.read_text()), config_section(pydocs_corpus))
    (work / "base.yaml").write_text(yaml.safe_dump(base))
    spec = {"name": "fair", "base": "base.yaml", "baseline": "adamw", "final_seeds": [1, 2],
            "output_dir": str(work / "out"),
            "arms": [{"name": "adamw", "optimizer": {"type": "adam", "beta1": 0.9}, "grid": {"learning_rate": [1e-3, 2e-3]}},
                     {"name": "mars-m", "optimizer": {"type": "mars-m"}, "grid": {"learning_rate": [4e-3]}}]}  # fmt: skip
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    parsed, overrides, _ = parse(["--config_path", str(work / "spec.yaml")])
    comparison = open_comparison(parsed, overrides)
    from levanter_mars.compare.run_configs import write_config

    found = {}
    for arm, lr, seed in (("adamw", 1e-3, 1), ("mars-m", 4e-3, 1), ("adamw", 1e-3, 2)):
        key = RunKey(arm, (("learning_rate", lr),), seed)
        rid = f"{arm}-s{seed}"
        config = Path(write_config(comparison.layout, rid, comparison.config_of(key)))
        probe = work / f"{rid}.json"
        proc = run_python(*cli_arguments(config, prelude=prelude("install_first_batches_probe", out=str(probe))),
                          timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[(arm, seed)] = {**json.loads(probe.read_text()), "optimizer": yaml.safe_load(config.read_text())[
            "optimizer"]}  # fmt: skip
    return found


def test_at_one_seed_every_arm_starts_from_the_same_parameters_batches_and_loss(starts):
    adamw, mars = starts[("adamw", 1)], starts[("mars-m", 1)]
    assert adamw["optimizer"]["type"] == "adam" and mars["optimizer"]["type"] == "mars-m"
    assert adamw["parameters_sha256"] == mars["parameters_sha256"]
    assert adamw["token_ids"] == mars["token_ids"] and len(adamw["token_ids"]) == 2
    assert adamw["token_ids"][0] != adamw["token_ids"][1]  # two batches, not one read twice
    assert adamw["initial_loss"] == mars["initial_loss"]


def test_another_seed_starts_elsewhere(starts):
    one, two = starts[("adamw", 1)], starts[("adamw", 2)]
    assert one["parameters_sha256"] != two["parameters_sha256"]
    assert one["token_ids"][0] != two["token_ids"][0]
    assert one["initial_loss"] != two["initial_loss"]
