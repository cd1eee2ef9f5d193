"""MARS-M through the training CLI on the tiny config: it trains, evaluates, and resumes bitwise from a checkpoint."""

import json

import pytest

from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.run.metrics import read_metrics
from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import (
    describe_failure,
    rerun_matches_reference,
    run_cli,
    run_paths,
    tiny_config,
)

pytestmark = pytest.mark.slow

MARS_M = {"optimizer": {"type": "mars-m", "learning_rate": 1e-2}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("mars-m")


@pytest.fixture(scope="module")
def reference_run(workdir, pydocs_corpus):
    """An uninterrupted MARS-M run: ``{"mars-m": (config, proc, paths)}``, shaped like ``reference_runs``."""
    config = tiny_config(workdir, pydocs_corpus, "ref-mars-m", MARS_M)
    proc = run_cli(config)
    assert proc.returncode == 0, describe_failure(proc)
    return {"mars-m": (config, proc, run_paths(workdir, "ref-mars-m"))}


def test_trains_and_evaluates(reference_run):
    _, proc, paths = reference_run["mars-m"]
    records = read_metrics(paths["metrics"])
    assert [r["step"] for r in records] == list(range(30))
    assert all("optim/learning_rate" in r and "optim/gamma" in r for r in records)
    evals = [r["eval/loss"] for r in records if "eval/loss" in r]
    assert len(evals) >= 3 and evals[-1] < evals[0] - 0.5, evals
    manifest = json.loads((paths["checkpoints"] / "step-29" / MANIFEST_NAME).read_text())
    assert manifest["run_info"]["optimizer"]["type"] == "mars-m"


def test_resumes_bitwise_from_its_step_20_checkpoint(workdir, reference_run):
    """The MARS-M state (no second moment for matrices) survives a checkpoint: the reference run's files up to step
    20, what a kill right after that checkpoint leaves (kills themselves: tests/test_reliability.py), resume to the
    reference's losses bit for bit."""
    reference_config, _, reference_paths = reference_run["mars-m"]
    config, paths = copy_of_run(reference_config, reference_paths, workdir, up_to_step=20, run_id="resumed-mars-m")
    assert not (paths["checkpoints"] / "step-29").exists()
    rerun_matches_reference(config, paths, reference_run, mode="mars-m", resumed_from=20)
