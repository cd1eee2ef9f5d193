"""A preemption costs no steps (training/preemption.py): SIGTERM, as a spot VM gets it about 30 s before it stops,
makes the run save the step it is at and stop with exit 9; the rerun resumes at the next step, 0 steps redone, its
losses bitwise the uninterrupted run's. A save that outlasts trainer.preemption_grace_s leaves the previous checkpoint
the resume point. (The 2-host pod: tests/test_preemption_pod.py.)"""

import json

import pytest

from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.errors import ExitCode
from levanter_mars.training.run.goodput.record import GOODPUT_FILENAME
from tests.helpers.faults import prelude
from tests.helpers.pod import run_helper_processes
from tests.helpers.seeds import seeded_random
from tests.helpers.training import (
    describe_failure,
    last_step,
    output,
    rerun_matches_reference,
    run_cli,
    run_paths,
    tiny_config,
)

pytestmark = pytest.mark.slow


def _attempts(paths):
    return json.loads((paths["run_dir"] / GOODPUT_FILENAME).read_text())["attempts"]


def test_sigterm_saves_the_step_and_the_rerun_redoes_none(tmp_path, pydocs_corpus, reference_runs):
    run_id = "preempted"
    config = tiny_config(tmp_path, pydocs_corpus, run_id)
    paths = run_paths(tmp_path, run_id)
    # Between the periodic checkpoints (10, 20): without the notice's save the rerun would redo steps.
    notice_at = seeded_random(run_id).choice([*range(12, 20), *range(22, 29)])
    preempted = run_cli(config, prelude=prelude("install_sigterm_at_step", step=notice_at))
    assert preempted.returncode == ExitCode.PREEMPTED, describe_failure(preempted)
    saved = notice_at - 1  # the notice came before step notice_at ran: the last step done is saved
    assert f"preempted: saved at step {saved}" in output(preempted)
    assert (paths["checkpoints"] / f"step-{saved}" / MANIFEST_NAME).exists()
    assert last_step(paths["metrics"]) == saved

    rerun_matches_reference(config, paths, reference_runs, resumed_from=saved)
    first, second = _attempts(paths)
    assert first["exit_code"] == ExitCode.PREEMPTED and first["ended_as"] == f"preempted, saved at step {saved}"
    assert first["preemption"]["saved_step"] == saved and first["preemption"]["save_seconds"] >= 0
    assert second["first_step"] == saved + 1 and first["steps_redone_next"] == 0
    assert second["ended_as"] == "done"


@pytest.mark.extended
def test_a_save_past_the_grace_leaves_the_previous_checkpoint_the_resume_point(tmp_path, pydocs_corpus,
                                                                                reference_runs):
    run_id = "preempted-slow-save"
    config = tiny_config(tmp_path, pydocs_corpus, run_id, {"trainer": {"preemption_grace_s": 1.0}})
    paths = run_paths(tmp_path, run_id)
    notice_at = seeded_random(run_id).randint(12, 19)
    saved = notice_at - 1
    faults = "\n".join([prelude("install_sigterm_at_step", step=notice_at),
                        prelude("install_slow_checkpoint_write", step=saved, seconds=120.0)])
    preempted = run_cli(config, prelude=faults)
    assert preempted.returncode == ExitCode.PREEMPTED, describe_failure(preempted)
    assert "was not written within trainer.preemption_grace_s=1 s" in output(preempted)
    assert not (paths["checkpoints"] / f"step-{saved}" / MANIFEST_NAME).exists(), "torn: no commit marker"
    assert not (paths["checkpoints"] / f"step-{saved}" / "metadata.json").exists()

    rerun_matches_reference(config, paths, reference_runs, resumed_from=10)
    assert list(paths["checkpoints"].parent.glob(f"{run_id}.quarantine/step-{saved}.*")), "the torn save set aside"
    first, second = _attempts(paths)
    assert first["ended_as"] == "preempted, not saved" and first["preemption"]["saved_step"] is None
    assert second["first_step"] == 11 and first["steps_redone_next"] == saved - 10


@pytest.mark.multidevice
def test_a_notice_to_one_host_reaches_every_host_at_the_same_step():
    """The pod's half, cheaply, through the training program's own start of jax.distributed (no Levanter init path,
    no setting turns the preemption service off): SIGTERM to process 1 does not end it, and both processes learn of it
    at one step boundary, the same, after the notice. (The whole pod, saving and resuming:
    tests/test_preemption_pod.py.)"""
    first, second = run_helper_processes("tests.helpers.preemption_notice", num_processes=2)
    assert first["reached"] is not None and first["reached"] == second["reached"], (first, second)
    assert first["reached"] > first["notice_at"]
