"""Faults, bad input and numerical trouble never cost a run or a checkpoint (end to end, tiny config, CLI).

Every run that is killed, fails or is poisoned is rerun with the same command, and must then finish with train losses
bitwise identical to an uninterrupted run (tests/conftest.py: reference_runs).
"""

import json

import numpy as np
import pytest

from levanter_mars.training.checkpointing.audit import audit_checkpoint, audit_run
from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.run.metrics import read_metrics
from tests.helpers.checkpoint_arrays import checkpoint_arrays
from tests.helpers.faults import prelude
from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import (
    REFERENCE_MODES,
    describe_failure,
    losses,
    output,
    rerun_matches_reference,
    run_cli,
    run_cli_in_process,
    run_paths,
    tiny_config,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


# ------------------------------------------------------------------------------------------------ kill -9


def _reference(reference_runs, mode="approx"):
    config, _, paths = reference_runs[mode]
    return config, paths


def _run_with_fault(workdir, pydocs_corpus, run_id, fault, expected_returncode, **fault_args):
    config = tiny_config(workdir, pydocs_corpus, run_id)
    proc = run_cli(config, prelude=prelude(fault, **fault_args))
    assert proc.returncode == expected_returncode, describe_failure(proc)
    return config, run_paths(workdir, run_id), proc


def test_kill_during_an_async_checkpoint_write(workdir, pydocs_corpus, reference_runs):
    run_id = "kill-mid-write"
    config, paths, _ = _run_with_fault(workdir, pydocs_corpus, run_id, "install_kill_during_checkpoint_write", -9, step=20)
    torn = paths["checkpoints"] / "step-20"
    assert torn.exists() and not (torn / "metadata.json").exists(), "the kill landed mid-write"
    rerun = rerun_matches_reference(config, paths, reference_runs, resumed_from=10)
    assert "Skipping incomplete checkpoint" in output(rerun)
    assert list((workdir / "checkpoints" / f"{run_id}.quarantine").glob("step-20.*"))


def test_kill_between_metadata_and_manifest(workdir, reference_runs):
    """A checkpoint whose arrays and metadata are complete but whose manifest was never written (the process died
    between the two) still resumes. Derived from the reference run: its files up to step 20, less the manifest."""
    config, paths = copy_of_run(*_reference(reference_runs), workdir, up_to_step=20, run_id="kill-before-manifest")
    step20 = paths["checkpoints"] / "step-20"
    (step20 / MANIFEST_NAME).unlink()
    assert (step20 / "metadata.json").exists()
    assert audit_checkpoint(str(step20)).state == "unverified"
    # Its arrays were complete, so it is used; it stays "unverified" (nothing can vouch for its bytes now).
    rerun_matches_reference(config, paths, reference_runs, resumed_from=20, unverified=(20,))


def test_kill_right_after_a_checkpoint(workdir, pydocs_corpus, reference_runs):
    config, paths, _ = _run_with_fault(workdir, pydocs_corpus, "kill-after-checkpoint", "install_kill_after_manifest", -9,
                                       step=20)
    assert (paths["checkpoints"] / "step-20" / MANIFEST_NAME).exists()
    assert not (paths["checkpoints"] / "step-29").exists()
    rerun_matches_reference(config, paths, reference_runs, resumed_from=20)


def test_a_second_launch_of_a_live_run_is_refused_ctrl_c_releases_it_and_a_dead_holders_lease_is_taken(
    workdir, reference_runs
):
    """One live launch per run (training/run/lease.py). Derived from the reference run up to step 20: a launch held
    alive at step 22, the same command again (refused at once, exit 8, nothing written); then Ctrl-C of the live one
    (exit 130, no traceback, its lease released, its goodput attempt closed with 130); then the lease a kill -9 would
    have left put back (its holder's process is gone on this machine) and the same command: it takes the run and
    finishes like the uninterrupted run."""
    import signal
    import time

    from levanter_mars.training.run.goodput import read_record
    from tests.helpers.training import start_cli

    config, paths = copy_of_run(*_reference(reference_runs), workdir, up_to_step=20, run_id="leased")
    held, log = workdir / "leased-held", workdir / "leased-live.log"
    live = start_cli(config, prelude=prelude("install_pause_at_step", step=22, signal_path=str(held)), log_path=log)
    try:
        deadline = time.monotonic() + 300
        while not held.exists() and live.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert held.exists(), log.read_text()[-3000:]
        lease = paths["checkpoints"].parent / (paths["checkpoints"].name + ".lease.json")
        left_by_a_kill = lease.read_bytes()
        holder = json.loads(left_by_a_kill)
        before = {p: p.read_bytes() for p in sorted(paths["checkpoints"].rglob("*")) if p.is_file()}
        before_metrics = paths["metrics"].read_bytes()

        started = time.monotonic()
        second = run_cli(config)
        print(f"the second launch refused in {time.monotonic() - started:.1f} s (exit {second.returncode})")
        assert second.returncode == 8, describe_failure(second)  # the run is live elsewhere
        assert f"the run is live elsewhere: pid {holder['pid']} on host" in output(second), output(second)[-3000:]
        assert "--take_over true" in output(second)
        assert {p: p.read_bytes() for p in sorted(paths["checkpoints"].rglob("*")) if p.is_file()} == before
        assert paths["metrics"].read_bytes() == before_metrics
        assert json.loads(lease.read_text())["token"] == holder["token"]

        live.send_signal(signal.SIGINT)  # Ctrl-C
        assert live.wait(120) == 130, log.read_text()[-3000:]
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    said = log.read_text()
    assert "Traceback" not in said and "interrupted: the run stopped" in said, said[-3000:]
    assert not lease.exists(), "Ctrl-C released the lease"
    assert read_record(paths["run_dir"] / "goodput.json")["attempts"][-1]["exit_code"] == 130
    lease.write_bytes(left_by_a_kill)  # as a kill -9 of the same process would have left it
    rerun = rerun_matches_reference(config, paths, reference_runs, resumed_from=20)
    assert f"its holder, pid {holder['pid']} on this machine, is gone" in output(rerun)
    assert not lease.exists(), "released at the end"


# --------------------------------------------------------------------------------------- corrupt checkpoints


# Every kind of corruption is detected by tests/test_checkpoint_integrity.py; end to end we check the two that reach
# different code: a truncated array (tests/test_train_e2e.py) and unreadable metadata (here), which Levanter's own
# checkpointer would crash on before any of our code could skip it.
def test_unreadable_metadata_of_the_newest_checkpoint_is_skipped(workdir, reference_runs):
    """Derived from the reference run: its files up to step 20 (what a kill right after step 20's checkpoint
    leaves), then step 20's metadata.json cut short."""
    config, paths = copy_of_run(*_reference(reference_runs), workdir, up_to_step=20, run_id="corrupt-metadata")
    (paths["checkpoints"] / "step-20" / "metadata.json").write_text('{"step": 20, "timest')
    rerun = rerun_matches_reference(config, paths, reference_runs, resumed_from=10)
    assert "Skipping corrupt checkpoint" in output(rerun)


# ----------------------------------------------------------------------------------- disk full, bad path


@pytest.mark.parametrize("asynchronous", [False, True], ids=["at-write", "in-background"])
def test_disk_full_stops_cleanly_and_keeps_the_last_good_checkpoint(
    workdir, pydocs_corpus, reference_runs, asynchronous
):
    run_id = f"disk-full-{'async' if asynchronous else 'sync'}"
    config, paths, failed = _run_with_fault(workdir, pydocs_corpus, run_id, "install_disk_full_at_checkpoint", 5,
                                            step=20, asynchronous=asynchronous)  # exit 5: checkpoint storage
    assert "No space left on device" in failed.stderr and "previous checkpoint is intact" in failed.stderr
    assert audit_checkpoint(str(paths["checkpoints"] / "step-10")).state == "verified"
    rerun_matches_reference(config, paths, reference_runs, resumed_from=10)


def test_unwritable_checkpoint_path_fails_before_training(workdir, pydocs_corpus, capsys):
    blocker = workdir / "a-file"
    blocker.write_text("not a directory")
    config = tiny_config(workdir, pydocs_corpus, "unwritable", {"trainer": {"checkpointer": {"base_path": str(blocker)}}})
    code, out = run_cli_in_process(capsys, config)  # it stops before anything is built: no subprocess needed
    assert code == 2, out[-3000:]
    assert "trainer.checkpointer.base_path" in out and str(blocker) in out
    assert not run_paths(workdir, "unwritable")["metrics"].exists()


# ------------------------------------------------------------------------------------------ numerics


def _all_checkpoint_arrays_finite(checkpoint_root):
    for step_dir in sorted(checkpoint_root.glob("step-*")):
        for name, array in checkpoint_arrays(step_dir).items():
            if np.issubdtype(array.dtype, np.floating):
                assert np.all(np.isfinite(array)), (step_dir.name, name)


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_nan_batch_is_skipped_and_counted(workdir, pydocs_corpus, mode):
    run_id = f"nan-skip-{mode}"
    config = tiny_config(workdir, pydocs_corpus, run_id, REFERENCE_MODES[mode])
    paths = run_paths(workdir, run_id)
    proc = run_cli(config, prelude=prelude("install_poisoned_batches", scales={15: "nan"}))
    assert proc.returncode == 0, describe_failure(proc)
    records = {r["step"]: r for r in read_metrics(paths["metrics"])}
    assert [records[s]["optim/skipped_steps"] for s in (14, 15, 16, 29)] == [0, 1, 1, 1]
    assert records[15]["train/loss"] == "nan"
    assert all(isinstance(records[s]["train/loss"], float) for s in range(16, 30))
    assert "update was skipped" in output(proc)
    _all_checkpoint_arrays_finite(paths["checkpoints"])


def test_nan_batch_stops_the_run_when_asked_and_the_rerun_resumes(workdir, pydocs_corpus, reference_runs):
    run_id = "nan-stop"
    config = tiny_config(workdir, pydocs_corpus, run_id, {"trainer": {"nonfinite": "stop"}})
    paths = run_paths(workdir, run_id)
    stopped = run_cli(config, prelude=prelude("install_poisoned_batches", scales={15: "nan"}))
    assert stopped.returncode == 3, describe_failure(stopped)  # a non-finite stop, not a crash
    assert "step 15" in stopped.stderr and "trainer.nonfinite=stop" in stopped.stderr
    assert sorted(p.name for p in paths["checkpoints"].glob("step-*")) == ["step-10"]
    _all_checkpoint_arrays_finite(paths["checkpoints"])
    rerun_matches_reference(config, paths, reference_runs, resumed_from=10)


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_huge_gradient_batch_does_not_wreck_training(workdir, pydocs_corpus, reference_runs, mode):
    run_id = f"huge-{mode}"
    config = tiny_config(workdir, pydocs_corpus, run_id, REFERENCE_MODES[mode])
    paths = run_paths(workdir, run_id)
    proc = run_cli(config, prelude=prelude("install_poisoned_batches", scales={15: 1e6}))
    assert proc.returncode == 0, describe_failure(proc)
    got, reference = losses(paths["metrics"]), losses(reference_runs[mode][2]["metrics"])
    records = read_metrics(paths["metrics"])
    assert all(r["optim/skipped_steps"] == 0 for r in records), "a finite batch is not skipped"
    assert got[14] == reference[14] and got[15] != reference[15]
    # The global clip and the per-tensor clip of c_t bound the step: training carries on as before.
    assert abs(got[29] - reference[29]) < 0.1, (got[29], reference[29])
    _all_checkpoint_arrays_finite(paths["checkpoints"])


# ------------------------------------------------------------------------------- resume with another optimizer


def test_resume_with_a_different_optimizer_is_refused(workdir, reference_runs, capsys):
    """The reference run's MARS-AdamW checkpoints, resumed with Adam: refused before anything is built (so in this
    process), a config error (exit 2: no retry can resume another optimizer's state) naming the field and both
    optimizers, and nothing is quarantined."""
    reference_config, reference_paths = _reference(reference_runs)
    config, paths = copy_of_run(reference_config, reference_paths, workdir, up_to_step=20, run_id="optimizer-switch")
    code, out = run_cli_in_process(capsys, config, "--optimizer.type", "adam", "--optimizer.learning_rate", "1e-3")
    assert code == 2 and "config error:" in out, out[-3000:]
    assert "optimizer.type='mars-adamw'" in out and "optimizer.type='adam'" in out, out[-3000:]
    assert [s.state for s in audit_run(str(paths["checkpoints"]))] == ["verified", "verified"], "nothing quarantined"
    manifest = json.loads((paths["checkpoints"] / "step-20" / MANIFEST_NAME).read_text())
    assert manifest["run_info"]["optimizer"]["type"] == "mars-adamw"
