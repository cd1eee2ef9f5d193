"""End-to-end training through the CLI on the tiny config: metrics, checkpoints, exact mode, bitwise resume."""

import json

import pytest

from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.run.metrics import read_metrics
from tests.helpers.faults import prelude
from tests.helpers.scenarios import copy_of_run
from tests.helpers.seeds import seeded_random
from tests.helpers.training import (
    REFERENCE_MODES,
    describe_failure,
    last_step,
    losses,
    output,
    run_cli,
    run_paths,
    tiny_config,
)

pytestmark = pytest.mark.slow

MODES = REFERENCE_MODES


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


def _finished(reference_runs, mode="approx"):
    config, _, paths = reference_runs[mode]
    return config, paths


@pytest.mark.parametrize("mode", sorted(MODES))
def test_run_writes_metrics_checkpoints_and_summary(reference_runs, mode):
    config, proc, paths = reference_runs[mode]
    records = read_metrics(paths["metrics"])
    assert [r["step"] for r in records] == list(range(30)), "one record per step, no gaps or repeats"
    for record in records:
        for key in ("train/loss", "optim/learning_rate", "optim/learning_rate_1d", "optim/skipped_steps"):
            assert key in record, (key, record)
    evals = [r["eval/loss"] for r in records if "eval/loss" in r]
    assert len(evals) >= 3 and evals[-1] < evals[0] - 0.5, evals
    assert records[-1]["optim/learning_rate_1d"] == pytest.approx(records[-1]["optim/learning_rate"] / 2)
    # Periodic checkpoints and the final one, each with a manifest.
    steps = sorted(int(p.name.split("-")[1]) for p in paths["checkpoints"].glob("step-*"))
    assert steps == [10, 20, 29], steps
    for step in steps:
        assert (paths["checkpoints"] / f"step-{step}" / MANIFEST_NAME).exists()
    manifest = json.loads((paths["checkpoints"] / "step-29" / MANIFEST_NAME).read_text())
    assert manifest["run_info"]["optimizer"]["type"] == "mars-adamw"
    assert manifest["run_info"]["optimizer"]["exact"] is (mode == "exact")
    assert (paths["run_dir"] / "loss_curve.png").stat().st_size > 10_000
    assert str(paths["metrics"]) in proc.stdout and "30 steps done" in proc.stdout


def test_exact_and_approx_differ(reference_runs):
    approx = losses(reference_runs["approx"][2]["metrics"])
    exact = losses(reference_runs["exact"][2]["metrics"])
    # That the first update uses a zero previous gradient in both modes is checked where it can fail, on the first
    # moment (tests/test_mars_api.py::test_step_one_uses_zero_previous_gradient_in_exact_mode). The losses cannot
    # tell: the first update hardly depends on c_1's scale (the per-tensor clip; Adam's first step is about
    # sign(c_1)), and they agreed at step 1 even with exact mode's first previous gradient left unzeroed.
    assert any(approx[s] != exact[s] for s in range(5, 30))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_kill_9_then_rerun_is_bitwise_identical(workdir, pydocs_corpus, reference_runs, mode):
    run_id = f"killed-{mode}"
    config = tiny_config(workdir, pydocs_corpus, run_id, MODES[mode])
    paths = run_paths(workdir, run_id)
    # SIGKILLed by the fault hook as a seeded step (different per mode) is about to run, once the step-10 checkpoint
    # is complete: the resumed run redoes the lost steps exactly. A poll could miss the step on an idle machine.
    kill_at = seeded_random(run_id).randint(12, 25)
    killed = run_cli(config, prelude=prelude("install_kill_at_step", step=kill_at, once_exists=str(
        paths["checkpoints"] / "step-10" / MANIFEST_NAME)))
    assert killed.returncode == -9, describe_failure(killed)
    assert 10 <= last_step(paths["metrics"]) < 29

    resumed = run_cli(config)
    assert resumed.returncode == 0, describe_failure(resumed)
    assert "Resuming from" in output(resumed)
    assert "Unknown leaf type" not in output(resumed)  # compat defect 43: the state's None leaves, skipped as they are
    reference = losses(reference_runs[mode][2]["metrics"])
    got = losses(paths["metrics"])
    assert sorted(got) == list(range(30)), "the resumed file has each step once"
    mismatches = {s: (got[s], reference[s]) for s in reference if got[s] != reference[s]}
    assert not mismatches, mismatches


def test_second_run_of_a_finished_command_resumes_not_restarts(reference_runs):
    config, _, paths = reference_runs["approx"]
    before = paths["metrics"].read_text()
    again = run_cli(config)
    assert again.returncode == 0, describe_failure(again)
    assert "already complete" in output(again)
    assert paths["metrics"].read_text() == before


def test_fresh_sets_the_previous_run_aside(workdir, reference_runs):
    """A finished run (the reference run's files, copied) started again with ``--fresh true``: the old run directory
    and checkpoints are moved aside, and the new run starts at step 0."""
    config, paths = copy_of_run(*_finished(reference_runs), workdir, up_to_step=29, run_id="fresh")
    again = run_cli(config, "--fresh", "true", "--trainer.num_train_steps", "3", "--trainer.steps_per_eval", "2")
    assert again.returncode == 0, describe_failure(again)
    assert [r["step"] for r in read_metrics(paths["metrics"])] == [0, 1, 2]
    (old_checkpoints,) = paths["checkpoints"].parent.glob("fresh.old-*")
    assert sorted(p.name for p in old_checkpoints.glob("step-*")) == ["step-10", "step-20", "step-29"], "kept"
    (old_run,) = paths["run_dir"].parent.glob("fresh.old-*")
    assert [r["step"] for r in read_metrics(old_run / "metrics.jsonl")] == list(range(30))


def test_torn_newest_checkpoint_is_skipped_for_the_previous_one(workdir, reference_runs):
    """The reference run's files, copied; the largest array file of its newest checkpoint (step-29) then loses its
    second half, so its manifest no longer matches."""
    config, paths = copy_of_run(*_finished(reference_runs), workdir, up_to_step=29, run_id="torn")
    victim = max((p for p in (paths["checkpoints"] / "step-29").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    rerun = run_cli(config)
    assert rerun.returncode == 0, describe_failure(rerun)
    log = output(rerun)
    assert "Skipping corrupt checkpoint" in log and "step-29" in log
    assert "Resuming from" in log and "step-20" in log
    quarantined = list((workdir / "checkpoints" / "torn.quarantine").glob("step-29.*"))
    assert quarantined and (quarantined[0] / "QUARANTINE_REASON.txt").exists()
    assert (paths["checkpoints"] / "step-29" / MANIFEST_NAME).exists(), "the final checkpoint was rewritten"
    # Steps 20..29 were redone from step-20 with the same data and seed: identical to the uninterrupted run.
    assert losses(paths["metrics"]) == losses(reference_runs["approx"][2]["metrics"])


def test_exact_mode_microbatches_its_second_gradient(workdir, pydocs_corpus, reference_runs):
    """With per_device_parallelism below the batch, both gradients are accumulated over microbatches. The result
    must match the unmicrobatched exact run up to summation order."""
    run_id = "exact-microbatched"
    config = tiny_config(workdir, pydocs_corpus, run_id, {"optimizer": {"exact": True},
                                                          "trainer": {"per_device_parallelism": 2}})
    proc = run_cli(config)
    assert proc.returncode == 0, describe_failure(proc)
    got, reference = losses(run_paths(workdir, run_id)["metrics"]), losses(reference_runs["exact"][2]["metrics"])
    assert got.keys() == reference.keys()
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in reference)
    assert 0 < worst < 1e-3, worst  # not bitwise (4 microbatches sum in another order), but the same training


def test_wandb_is_offline_unless_configured(workdir, pydocs_corpus, monkeypatch):
    from levanter.tracker.wandb import WandbConfig

    from levanter_mars.training.config import parse_config
    from levanter_mars.compat.tracking import wandb_offline_unless_configured

    wandb_config = tiny_config(workdir, pydocs_corpus, "wb", {"trainer": {"tracker": {"type": "wandb"}}})
    config = parse_config(["--config_path", str(wandb_config)])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert isinstance(config.trainer.tracker, WandbConfig) and config.trainer.tracker.mode is None
    wandb_offline_unless_configured(config.trainer)
    assert config.trainer.tracker.mode == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    online = parse_config(["--config_path", str(wandb_config)])
    wandb_offline_unless_configured(online.trainer)
    assert online.trainer.tracker.mode is None
