"""A run that limps (issue 45): ``--num_slices 2,1`` plans every count with the same global batch, refuses a count
that cannot cut it before anything starts, runs each attempt on the largest count whose slices are up, grows back
at a checkpoint once slices return, and records each attempt's slice count and why it changed. The whole path on a
local pod with a slice preempted: tests/test_infra_local_limping.py (extended)."""

import json
import shlex

import pytest

from levanter_mars.infra import pod
from levanter_mars.infra.config import LaunchError, parse_slice_counts
from levanter_mars.infra.slice_choice import (
    ScaleUpWatch,
    change_note,
    first_count,
    largest_up,
    next_count,
    settle_after_preemption,
    wait_for_slices,
)
from levanter_mars.program_config import parse_train_config
from levanter_mars.training.outcome import RetryBudget
from levanter_mars.training.run import resize
from levanter_mars.training.run.goodput import GoodputRecord
from levanter_mars.training.run.goodput.clock import PhaseClock
from levanter_mars.training.run.goodput.report import describe
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV
from tests.helpers.ray_launch import dry_run
from tests.helpers.training import POLL_S, losses, output, rerun_matches_reference, run_cli, run_paths, tiny_config


@pytest.mark.parametrize("typed, counts", [("2,1", (2, 1)), ("1,2", (2, 1)), ("4", (4,)), (3, (3,)),
                                           ("4,2,1", (4, 2, 1))])  # fmt: skip
def test_slice_counts_are_read_largest_first(typed, counts):
    assert parse_slice_counts(typed) == counts


@pytest.mark.parametrize("typed, said", [("2,2", "each count once"), ("2,0", "must be >= 1"), ("two", "a count")])
def test_bad_slice_counts_are_refused_naming_the_flag(typed, said):
    with pytest.raises(LaunchError, match=said) as raised:
        parse_slice_counts(typed)
    assert "--num_slices" in str(raised.value)


def _limping_dry_run(capsys, monkeypatch, tmp_path, corpus, counts: str, batch: int = 8):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tiny_config(tmp_path, corpus, "limp-dry", {"trainer": {"train_batch_size": batch}})
    argv = ["--config_path", str(config), "--tpu_type", "cpu", "--num_slices", counts, "--num_hosts", "1",
            "--devices_per_host", "2", "--scale_up_wait_s", "30",
            "--", "--trainer.replica_dcn_axis_size", "-1"]  # fmt: skip
    return dry_run(capsys, *argv)


def test_a_run_that_may_limp_keeps_its_batch_and_takes_more_microbatches_on_fewer_slices(
    capsys, monkeypatch, tmp_path, pydocs_corpus
):
    plan, config, _ = _limping_dry_run(capsys, monkeypatch, tmp_path, pydocs_corpus, "2,1")
    # 8 examples on 2 slices x 2 devices: 2 per device, pinned, so 1 slice takes 2 microbatches of 4.
    assert config["trainer"]["per_device_parallelism"] == 2 and config["trainer"]["train_batch_size"] == 8
    limping = plan["limping"]
    assert limping["allowed_slice_counts"] == [2, 1] and limping["scale_up_wait_s"] == 30
    two = "replica 2 (DCN 2 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 2 slice(s) of 2 device(s)"
    one = "replica 1 (DCN 1 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 1 slice(s) of 2 device(s)"
    assert limping["per_count"][2] == {"mesh": two, "microbatches_per_step": 1}
    assert limping["per_count"][1] == {"mesh": one, "microbatches_per_step": 2}
    assert plan["slices"] == 2 and plan["resources"]["total"]["TPU-cpu-head"] == 2  # the cluster holds the largest
    assert "--trainer.per_device_parallelism" in plan["training_command"]  # every attempt, every host
    entry = shlex.split(plan["ray_job"]["entrypoint"])
    assert entry[entry.index("--num_slices") + 1] == "2,1" and entry[entry.index("--scale_up_wait_s") + 1] == "30.0"
    assert entry[entry.index("--resize_request") + 1] == str(tmp_path / "checkpoints" / "limp-dry.resize.json")


def test_one_slice_count_pins_nothing_and_asks_nothing(capsys, monkeypatch, tmp_path, pydocs_corpus):
    plan, config, _ = _limping_dry_run(capsys, monkeypatch, tmp_path, pydocs_corpus, "2")
    assert config["trainer"]["per_device_parallelism"] == -1 and "limping" not in plan
    assert "--resize_request" not in plan["ray_job"]["entrypoint"]


def test_a_count_that_cannot_cut_the_batch_is_refused_before_anything_starts(capsys, monkeypatch, tmp_path,
                                                                            pydocs_corpus):  # fmt: skip
    """12 examples on 3 slices x 2 devices are 2 per device; 2 slices would need microbatches of 2 x 4 = 8."""
    from levanter_mars.infra import launch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tiny_config(tmp_path, pydocs_corpus, "limp-refused", {"trainer": {"train_batch_size": 12}})
    argv = ["--dry_run", "--config_path", str(config), "--tpu_type", "cpu", "--num_slices", "3,2", "--num_hosts", "1",
            "--devices_per_host", "2", "--", "--trainer.replica_dcn_axis_size", "-1"]  # fmt: skip
    assert launch.cli(argv) == 2
    out, err = capsys.readouterr()
    assert "--num_slices 3,2: on 2 slice(s) the global batch of 12 examples does not split into microbatches of 2 " \
           "example(s) on each of 4 devices" in err, err  # fmt: skip
    assert out == ""


def test_the_gcloud_path_refuses_a_run_that_would_limp(capsys):
    from levanter_mars.infra import gcloud

    argv = ["--dry_run", "--config_path", "config/gpt2_small_mars.yaml", "--tpu_type", "v4-8", "--num_slices", "2,1",
            "--project", "p", "--zone", "z", "--image", "i"]  # fmt: skip
    assert gcloud.cli(argv) == 2
    assert "the gcloud path queues one slice count" in capsys.readouterr().err


def test_preflight_compiles_every_allowed_count_and_one_that_does_not_fit_refuses(monkeypatch):
    """Pre-flight (the TPU compiler, a child process) runs once per count, the largest first."""
    from types import SimpleNamespace

    from levanter_mars.infra.preflight import launch_check

    asked = []

    def fake_preflight(command, **kwargs):
        count = int(command[command.index("--num_slices") + 1])
        asked.append(count)
        if count == 1:
            kwargs["stderr"].write("does not fit: 20.1 GiB of 15.7 GiB per chip\n")
            return SimpleNamespace(returncode=2, stdout="")
        return SimpleNamespace(returncode=0, stdout=f"table for {count}")

    monkeypatch.setattr(launch_check.subprocess, "run", fake_preflight)
    run = SimpleNamespace(slice=SimpleNamespace(is_local=False, name="v5litepod-4"), run_id="r",
                          job=SimpleNamespace(slice_counts=(2, 1)), train_argv=("--config_path", "c.yaml", "--x", "1"))
    code, text = launch_check.preflight_run(run, ".", skip=False)
    assert asked == [2, 1] and code == 2
    assert text == "on 1 slice(s): refused, nothing was submitted: does not fit: 20.1 GiB of 15.7 GiB per chip"
    asked.clear()
    run.job.slice_counts = (4, 2)
    tables = "# 4 slice(s)\ntable for 4\n# 2 slice(s)\ntable for 2"
    assert launch_check.preflight_run(run, ".", skip=False) == (0, tables)


def test_each_attempt_takes_the_largest_allowed_count_whose_slices_are_up():
    assert [largest_up((2, 1), up) for up in (0, 1, 2, 3)] == [None, 1, 2, 2]
    assert largest_up((4, 2), 3) == 2
    ups = iter([0, 0, 1])
    said = []
    assert wait_for_slices((2, 1), lambda: next(ups), poll_s=POLL_S, say=said.append) == 1
    assert said == ["waiting for slices: 0 up, the run needs at least 1"]
    assert change_note(None, 2, "x") is None and change_note(2, 2, "x") is None
    assert change_note(2, 1, "a host was lost") == "2 -> 1 slice(s): a host was lost"


def test_after_a_preemption_the_count_waits_until_ray_sees_the_slice_gone_or_the_settle_time_is_over():
    seen = iter([2, 2, 1])
    assert settle_after_preemption(2, lambda: next(seen), settle_s=60, poll_s=POLL_S) == 1
    assert settle_after_preemption(2, lambda: 2, settle_s=POLL_S, poll_s=POLL_S) == 2  # a host lost, no slice
    # A retry after a lost host settles; after a crash (exit 1) it counts at once; the largest count up is taken.
    looks = []
    assert next_count((2, 1), 2, [0, None], lambda: looks.append(1) or (2 if len(looks) < 3 else 1)) == 1
    assert len(looks) >= 3  # looked again until the slice was gone
    assert next_count((2, 1), 2, [1, 1], lambda: 2) == 2
    # After a preemption's notice was saved (exit 9) its slice goes within the notice: the count looks until it has
    # gone (here at the second look), within the short settle, not the lost host's.
    looks = []
    assert next_count((2, 1), 2, [9, 9], lambda: looks.append(1) or (2 if len(looks) < 2 else 1)) == 1
    assert len(looks) >= 2


def test_the_first_attempt_waits_for_the_largest_count_then_with_several_allowed_takes_what_is_up():
    assert first_count((2, 1), lambda: 2, wait_s=60, poll_s=POLL_S) == 2
    assert first_count((2, 1), lambda: 1, wait_s=POLL_S, poll_s=POLL_S) == 1  # after the wait: what is up
    ups = iter([1, 1, 2])
    assert first_count((2,), lambda: next(ups), wait_s=0, poll_s=POLL_S) == 2  # one count: waits for it


def test_a_run_on_fewer_slices_is_asked_to_grow_only_after_the_wait_and_once_slices_are_up(tmp_path):
    now = [100.0]
    up = [1]
    path = str(tmp_path / "run.resize.json")
    watch = ScaleUpWatch((2, 1), 1, lambda: up[0], wait_s=60, request_path=path, launch_id="L", clock=lambda: now[0])
    assert watch.check(since=100.0) is None  # slices up or not: too soon
    now[0] = 161.0
    assert watch.check(since=100.0) is None and resize.read(path) is None  # the wait is over, no slice is back
    up[0] = 2
    asked = watch.check(since=100.0)
    assert (asked.from_slices, asked.to_slices) == (1, 2) and "2 slice(s) up again after 61 s on 1" in asked.reason
    assert resize.pending_for(path, 1, "L") == asked  # to this launch's 1-slice attempt only:
    assert resize.pending_for(path, 2, "L") is None and resize.pending_for(path, 1, "another launch") is None
    assert watch.check(since=100.0) is None  # asked once
    assert ScaleUpWatch((2, 1), 2, lambda: 3, 0, path, "L").larger == []  # on the largest count: nothing to watch


def test_a_preempted_slice_is_retried_as_a_preemption_and_the_next_attempt_knows_why(capsys):
    from levanter_mars.compat.levanter_infra import SlicesPreempted

    seen = []

    def attempt(previous):
        seen.append(previous)
        if len(seen) == 1:
            raise SlicesPreempted("TPU job was preempted too many times")
        if len(seen) == 2:
            return [{"returncode": 7, "process": (0, 0)}]  # stopped at a checkpoint to grow, as asked
        return [{"returncode": 0, "process": (0, 0)}, {"returncode": 0, "process": (1, 0)}]

    assert pod.run_attempts(attempt, RetryBudget(preemption=1, resize=1)) == 0
    assert seen[0] is None
    assert (seen[1].retry_kind, seen[2].retry_kind) == ("preemption", "resize")
    assert "a slice of the attempt was preempted" in capsys.readouterr().err


def test_goodput_records_each_attempts_slice_count_and_why_it_changed(tmp_path):
    GoodputRecord.open(tmp_path, PhaseClock(started=1000.0), "L", slices=2).close(1, "lost")
    change = "2 -> 1 slice(s): a host was lost"
    record = GoodputRecord.open(tmp_path, PhaseClock(started=1000.0), "L", slices=1, slice_change=change)
    record.close(7, "ResizeRequested: stopped after the checkpoint of step 20")
    data = json.loads((tmp_path / "goodput.json").read_text())
    assert [a["slices"] for a in data["attempts"]] == [2, 1]
    assert "slice_change" not in data["attempts"][0]
    assert data["attempts"][1]["slice_change"] == "2 -> 1 slice(s): a host was lost"
    lines = describe(data)
    assert "1. launch L, its attempt 1 on 2 slice(s)" in lines[1]
    assert "2. launch L, its attempt 2 on 1 slice(s)" in lines[2]
    assert lines[3].strip() == "slices changed: 2 -> 1 slice(s): a host was lost"


@pytest.mark.slow
def test_a_run_asked_to_resize_stops_after_its_next_checkpoint_and_resumes_bitwise(tmp_path, pydocs_corpus,
                                                                                  reference_runs):  # fmt: skip
    """The request (for the 1-slice run it is) waits for the checkpoint of step 10, written whole; exit 7; the rerun
    (the launcher's next attempt) resumes there and trains every step as the uninterrupted reference did."""
    config = tiny_config(tmp_path, pydocs_corpus, "limp-resize")
    paths = run_paths(tmp_path, "limp-resize")
    path = resize.resize_request_path(parse_train_config(["--config_path", str(config)]))
    assert path == str(tmp_path / "checkpoints" / "limp-resize.resize.json")
    resize.request(path, from_slices=1, to_slices=2, reason="slices came back", launch_id="this-launch")
    stopped = run_cli(config, env={LAUNCH_ID_ENV: "this-launch"})
    assert stopped.returncode == 7, output(stopped)[-3000:]
    assert "stopped after the checkpoint of step 10, as the launcher asked (1 -> 2 slice(s): slices came back)" in \
        output(stopped)  # fmt: skip
    assert sorted(losses(paths["metrics"])) == list(range(11))  # step-10 holds steps 0..10
    goodput = json.loads((paths["run_dir"] / "goodput.json").read_text())
    assert goodput["attempts"][0]["exit_code"] == 7 and goodput["attempts"][0]["slices"] == 1
    # The next attempt (the driver clears the request before it; here it is left: a plain command never looks).
    rerun_matches_reference(config, paths, reference_runs, resumed_from=10)


def test_only_a_launchers_run_looks_for_requests_and_only_for_its_launch(monkeypatch, tmp_path, pydocs_corpus):
    config = parse_train_config(["--config_path", str(tiny_config(tmp_path, pydocs_corpus, "limp-who"))])
    monkeypatch.delenv(LAUNCH_ID_ENV, raising=False)
    assert resize.for_this_launch(config) is None  # a plain command
    monkeypatch.setenv(LAUNCH_ID_ENV, "L1")
    path, launch = resize.for_this_launch(config)
    assert (path, launch) == (resize.resize_request_path(config), "L1")
    resize.request(path, 1, 2, "left by an earlier launch", launch_id="L0")
    assert resize.pending_for(path, 1, launch) is None


def test_allowing_fewer_slices_keeps_a_derived_run_id(capsys, monkeypatch, tmp_path, pydocs_corpus):
    """A config without ``trainer.id`` gets one derived from its content: the pin must not change it, or a relaunch
    with ``2,1`` would start over instead of resuming."""
    import yaml

    config = tiny_config(tmp_path, pydocs_corpus, "unused")
    data = yaml.safe_load(config.read_text())
    del data["trainer"]["id"]
    config.write_text(yaml.safe_dump(data))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ids = []
    for counts in ("2", "2,1"):
        plan, _, _ = dry_run(capsys, "--config_path", str(config), "--tpu_type", "cpu", "--num_slices", counts,
                             "--devices_per_host", "2", "--", "--trainer.replica_dcn_axis_size", "-1")  # fmt: skip
        ids.append(plan["run_id"])
    assert ids[0] == ids[1] and ids[0].startswith("gpt2"), ids
