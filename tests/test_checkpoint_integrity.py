"""Checkpoint manifests: every kind of damage is detected, and bad checkpoints are moved aside, never deleted."""

import json

import pytest

from levanter_mars.training.checkpointing.audit import audit_checkpoint, audit_run
from levanter_mars.training.checkpointing.compatibility import check_compatible
from levanter_mars.training.checkpointing.manifest import write_manifest
from levanter_mars.training.checkpointing.quarantine import quarantine
from levanter_mars.training.checkpointing.storage import MANIFEST_NAME, check_writable
from levanter_mars.training.errors import CheckpointError


def _make_checkpoint(root, step, *, manifest=True):
    directory = root / f"step-{step}"
    (directory / "model" / "w").mkdir(parents=True)
    (directory / "model" / "w" / ".zarray").write_text('{"shape": [4]}')
    (directory / "model" / "w" / "0").write_bytes(bytes(range(64)) * 4)
    (directory / "opt_state" / "mu").mkdir(parents=True)
    (directory / "opt_state" / "mu" / "0").write_bytes(b"\x01" * 100)
    (directory / "metadata.json").write_text(json.dumps({"step": step, "timestamp": "2026-01-01T00:00:00"}))
    if manifest:
        write_manifest(str(directory), step=step, run_info={"optimizer": {"type": "mars-adamw", "exact": False}})
    return directory


def test_intact_checkpoint_verifies_with_its_run_info(tmp_path):
    status = audit_checkpoint(str(_make_checkpoint(tmp_path, 10)))
    assert status.state == "verified" and status.step == 10
    assert status.run_info["optimizer"]["type"] == "mars-adamw"


@pytest.mark.parametrize(
    "damage,state,reason",
    [
        (lambda d: (d / "model" / "w" / "0").unlink(), "corrupt", "missing file model/w/0"),
        (lambda d: (d / "model" / "w" / "0").write_bytes(b"\x00" * 10), "corrupt", "has 10 bytes"),
        (lambda d: (d / "opt_state" / "mu" / "0").write_bytes(b"\x02" * 100), "corrupt", "checksum mismatch"),
        (lambda d: (d / "metadata.json").write_text("{not json"), "corrupt", "unreadable metadata.json"),
        (lambda d: (d / "metadata.json").unlink(), "incomplete", "no metadata.json"),
        (lambda d: (d / MANIFEST_NAME).write_text("{"), "corrupt", "unreadable manifest"),
        (lambda d: (d / MANIFEST_NAME).unlink(), "unverified", "no manifest"),
        (lambda d: (d / MANIFEST_NAME).write_text('{"files": []}'), "corrupt", "unreadable manifest"),
        (lambda d: (d / MANIFEST_NAME).write_text('{"files": {}}'), "corrupt", "unreadable manifest"),
        (lambda d: (d / MANIFEST_NAME).write_text('{"files": {"model/w/0": 256}}'), "corrupt",
         "unreadable manifest"),
        (lambda d: (d / MANIFEST_NAME).write_text('{"files": {"model/w/0": {}}}'), "corrupt",
         "unreadable manifest"),
        (lambda d: (d / MANIFEST_NAME).write_text('null'), "corrupt", "unreadable manifest"),
    ],
    ids=["missing-file", "truncated", "same-size-flip", "bad-metadata", "no-metadata", "bad-manifest", "no-manifest",
         "manifest-files-a-list", "manifest-files-empty", "manifest-entry-not-a-mapping", "manifest-entry-empty",
         "manifest-null"],
)
def test_damage_is_detected(tmp_path, damage, state, reason):
    directory = _make_checkpoint(tmp_path, 10)
    damage(directory)
    status = audit_checkpoint(str(directory))
    assert status.state == state and reason in status.reason, status
    assert status.usable == (state == "unverified")


def test_size_only_audit_misses_a_same_size_flip_but_checksums_catch_it(tmp_path):
    directory = _make_checkpoint(tmp_path, 10)
    (directory / "opt_state" / "mu" / "0").write_bytes(b"\x02" * 100)
    assert audit_checkpoint(str(directory), verify_checksums=False).state == "verified"
    assert audit_checkpoint(str(directory), verify_checksums=True).state == "corrupt"


def test_audit_run_orders_usable_checkpoints_newest_first(tmp_path):
    for step in (10, 30, 20):
        _make_checkpoint(tmp_path, step)
    _make_checkpoint(tmp_path, 40, manifest=False)
    torn = tmp_path / "step-50"
    torn.mkdir()
    (tmp_path / "notes").mkdir()  # not a checkpoint: neither audited nor quarantined
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    statuses = audit_run(str(tmp_path))
    assert [(s.step, s.state) for s in statuses] == [
        (40, "unverified"), (30, "verified"), (20, "verified"), (10, "verified"), (None, "incomplete")
    ]
    assert [s.step for s in statuses if s.usable] == [40, 30, 20, 10]


def test_quarantine_moves_the_checkpoint_aside_with_its_reason(tmp_path):
    run_dir = tmp_path / "run"
    directory = _make_checkpoint(run_dir, 10)
    destination = quarantine(str(directory), "corrupt: checksum mismatch")
    assert not directory.exists()
    assert destination.startswith(str(tmp_path / "run.quarantine" / "step-10."))
    assert (tmp_path / destination / "QUARANTINE_REASON.txt").read_text().startswith("corrupt")
    assert (tmp_path / destination / "model" / "w" / "0").exists(), "nothing deleted"
    assert audit_run(str(run_dir)) == []


def test_incompatible_optimizer_is_refused(tmp_path):
    status = audit_checkpoint(str(_make_checkpoint(tmp_path, 10)))
    check_compatible(status, {"optimizer": {"type": "mars-adamw", "exact": False, "learning_rate": 1.0}})
    with pytest.raises(CheckpointError, match="optimizer.exact=False.*optimizer.exact=True"):
        check_compatible(status, {"optimizer": {"type": "mars-adamw", "exact": True}})
    with pytest.raises(CheckpointError, match="optimizer.type='mars-adamw'"):
        check_compatible(status, {"optimizer": {"type": "adam"}})


def test_a_checkpoint_recorded_before_amsgrad_existed_holds_no_running_max(tmp_path):
    status = audit_checkpoint(str(_make_checkpoint(tmp_path, 10)))
    assert "amsgrad" not in status.run_info["optimizer"], "the manifest is one written before the option existed"
    check_compatible(status, {"optimizer": {"type": "mars-adamw", "exact": False, "amsgrad": False}})
    with pytest.raises(CheckpointError, match="optimizer.amsgrad=False.*optimizer.amsgrad=True"):
        check_compatible(status, {"optimizer": {"type": "mars-adamw", "exact": False, "amsgrad": True}})


def test_unwritable_directory_is_reported_by_name(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="trainer.checkpointer.base_path.*file/run"):
        check_writable(str(blocker / "run"))
    check_writable(str(tmp_path / "fine"))


def test_when_every_checkpoint_is_bad_the_restart_from_scratch_is_reported(tmp_path, monkeypatch, caplog):
    import logging

    from levanter_mars.training.checkpointing.resume import load_first_usable, plan_resume

    run = tmp_path / "run"
    for step in (10, 20):
        (_make_checkpoint(run, step) / "metadata.json").unlink()  # both incomplete
    with caplog.at_level(logging.WARNING, logger="levanter_mars"):
        plan = plan_resume(str(run), {}, verify_checksums=True)
        assert plan.candidates == () and plan.quarantined == 2
        assert load_first_usable(plan, load=lambda path: pytest.fail(f"loaded {path}")) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "No usable checkpoint left" in errors[0] and "2 quarantined" in errors[0], errors
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "run.quarantine").iterdir()) == ["step-10", "step-20"]


def test_run_description_and_resume_check_agree_on_what_changes_the_state_layout(tmp_path):
    """A run described from its parsed config (what the manifest records) is refused by the resume check only for
    a change of optimizer state layout, never for a hyperparameter."""
    from levanter_mars.training.config import parse_config
    from levanter_mars.training.run.identity import describe_run
    from tests.helpers.training import TINY_CONFIG

    def described(*overrides):
        return describe_run(parse_config(["--config_path", str(TINY_CONFIG), *overrides]))

    directory = _make_checkpoint(tmp_path, 10, manifest=False)
    write_manifest(str(directory), step=10, run_info=described())
    status = audit_checkpoint(str(directory))
    check_compatible(status, described("--optimizer.learning_rate", "0.5"))
    with pytest.raises(CheckpointError, match="optimizer.exact"):
        check_compatible(status, described("--optimizer.exact", "true"))
    with pytest.raises(CheckpointError, match="optimizer.type"):
        check_compatible(status, described("--optimizer.type", "adam"))
