"""One outcome policy for every launcher (training/outcome.py): a table of mixed host outcomes, each judged alone and
through each launcher's own loop (the Ray job's driver, which the TPU pod and the local pod share, and the
plain-gcloud runner), with the number of attempts each makes. A 2-host local pod where only process 0 decides a stop
is tests/test_infra_local_ray.py."""

from __future__ import annotations

import pytest

from levanter_mars.compat.levanter_infra import SlicesPreempted
from levanter_mars.infra import pod
from levanter_mars.infra.pod import exits_after_loss
from levanter_mars.training.outcome import LOST, RetryBudget, judge, signal_exit
from tests.test_infra_gcloud import ScriptedGcloud, plan_for, run_scripted

SIGTERM, SIGKILL, SIGINT = signal_exit("SIGTERM"), signal_exit("SIGKILL"), signal_exit("SIGINT")

#: (hosts' exits, then the next attempt's if retried ..., what the launch ends with, attempts made). Budgets: 1
#: failure retry, 1 storage retry.
CASES = {
    "a decided stop on process 0 wins over the peer's signal it caused": ([[3, SIGTERM]], 3, 1),
    "a peer's decided stop wins over process 0's signal": ([[SIGKILL, 4]], 4, 1),
    "process 0 finished, a peer was killed: retried (a complete run reports complete)": ([[0, SIGKILL], [0, 0]], 0, 2),
    "a config error on every host: never retried": ([[2, 2]], 2, 1),
    "unusable storage on process 0, a crash beside it: retried within its budget": ([[5, 1], [0, 0]], 0, 2),
    "unusable storage past its budget: the run's own code": ([[5, 5], [5, 5]], 5, 2),
    "an exit the training program never makes (a broken image): not retried": ([[126, 126]], 1, 1),
    "crashes past the failure budget: give up": ([[1, 1], [1, 1]], 1, 2),
    "hosts that decided different stops: no decision": ([[3, 4]], 1, 1),
    "a crash, then done": ([[1, 0], [0, 0]], 0, 2),
    "a container killed for memory (128 + 9), as ssh reports it: a crash, retried": ([[137, 0], [0, 0]], 0, 2),
    "the run live elsewhere (a lease refused or taken over): never retried": ([[8, SIGTERM]], 8, 1),
    "a person's interrupt on a peer wins over process 0's crash: never retried": ([[1, 130]], 130, 1),
    "a process killed by SIGINT is a person's interrupt too": ([[SIGINT, SIGKILL]], 130, 1),
    "a person's interrupt wins over another decided stop": ([[130, 3]], 130, 1),
}
BUDGET = RetryBudget(failure=1, preemption=1, storage=1)


@pytest.mark.parametrize("case", CASES)
def test_the_verdicts_of_mixed_host_outcomes(case):
    attempts, code, count = CASES[case]
    used: dict[str, int] = {}
    for made, exits in enumerate(attempts, 1):
        verdict = judge(exits, BUDGET, used)
        if verdict.ends:
            break
        used[verdict.retry_kind] = used.get(verdict.retry_kind, 0) + 1
    assert (verdict.exit_code, made) == (code, count), verdict
    assert verdict.reason  # every verdict says why


@pytest.mark.parametrize("case", CASES)
def test_the_ray_driver_follows_the_policy(case, capsys):
    """The Ray job's driver (``python -m levanter_mars.infra.pod``: TPU pods and the local pod alike) with its
    attempts scripted: the hosts' results, as run_on_pod returns them, in any order."""
    attempts, code, count = CASES[case]
    script = iter(attempts)
    made = []

    def attempt(previous):
        exits = next(script)
        made.append(exits)
        return [{"returncode": c, "process": (0, i)} for i, c in reversed(list(enumerate(exits)))]

    assert pod.run_attempts(attempt, BUDGET) == code
    assert len(made) == count
    said = capsys.readouterr()
    assert ("launch done:" in said.out) == (code == 0), said


@pytest.mark.parametrize("case", CASES)
def test_the_gcloud_runner_follows_the_policy(case):
    attempts, code, count = CASES[case]
    plan = plan_for("--tpu_type", "v4-16", "--retries", "1", "--storage_retries", "1")  # 2 hosts
    fake = ScriptedGcloud(attempts=attempts)
    made, log = run_scripted(plan, fake)
    assert made == code, log
    train_calls = [c for c in fake.calls if c[3:5] == ["tpu-vm", "ssh"] and "--worker=all" not in c]
    assert len(train_calls) == 2 * count, log


def test_one_host_that_cannot_start_the_program_is_not_retried():
    verdict = judge([126], BUDGET, {})
    assert (verdict.action, verdict.exit_code) == ("give_up", 1) and "exit 126" in verdict.reason


def test_a_lost_host_is_a_preemption_with_its_own_budget():
    assert judge([0, LOST], BUDGET, {}).retry_kind == "preemption"
    assert judge([1, 1], BUDGET, {"preemption": 1}).action == "retry"  # failures have their own budget
    ended = judge([LOST, LOST], BUDGET, {"preemption": 1})
    assert (ended.action, ended.exit_code) == ("give_up", 1) and "preemption retries are spent" in ended.reason


def test_a_decided_stop_wins_over_a_lost_host():
    assert (judge([3, LOST], BUDGET, {}).action, judge([3, LOST], BUDGET, {}).exit_code) == ("stop", 3)
    assert judge([LOST, 4, LOST], BUDGET, {}).exit_code == 4
    assert judge([0, LOST], BUDGET, {}).retry_kind == "preemption"  # a host that finished decided nothing


def test_the_ray_driver_keeps_what_the_hosts_of_a_lost_slice_decided(capsys):
    """A slice lost while (or after) process 0 decided a stop: the hosts that ended reported their codes (the attempt's
    exit board), so the run's own stop ends the launch, where a lost slice alone is a preemption, retried."""
    script = iter([SlicesPreempted("slice 1 lost", exits=[3, LOST]), SlicesPreempted("slice 1 lost")])

    def attempt(previous):
        raise next(script)

    assert pod.run_attempts(attempt, BUDGET) == 3
    assert "process 0: exit 3 (nonfinite stop), process 1: host lost" in capsys.readouterr().err
    made = []

    def preempted_then_done(previous):
        made.append(previous)
        if len(made) == 1:
            raise SlicesPreempted("slice 1 lost")  # nothing reported: every host lost
        return [{"returncode": 0, "process": (0, 0)}]

    assert pod.run_attempts(preempted_then_done, BUDGET) == 0
    assert made[1].retry_kind == "preemption"


def test_the_exits_after_a_lost_slice_fill_the_unreported_hosts_as_lost():
    reported = [{"returncode": 3, "process": (0, 0)}, {"returncode": SIGTERM, "process": (1, 0)}]
    assert exits_after_loss(reported, hosts=4) == [3, SIGTERM, LOST, LOST]
    assert exits_after_loss([], hosts=2) == [LOST, LOST]


def test_when_the_cluster_cannot_run_an_attempt_it_is_a_failure_on_the_failure_budget(capsys):
    """Ray's errors that are no preemption (a TpuRunError: a host task that could not start, an actor that died) are
    retried on the failure budget, not the end of the launch."""
    tries = []

    def attempt(previous):
        tries.append(previous)
        if len(tries) == 1:
            raise RuntimeError("TpuRunError: the slice actor died")
        return [{"returncode": 0, "process": (0, 0)}]

    assert pod.run_attempts(attempt, BUDGET) == 0
    assert tries[1].retry_kind == "failure" and "could not run the attempt" in tries[1].reason

    def never(previous):
        raise RuntimeError("TPU job was preempted too many times")

    assert pod.run_attempts(never, BUDGET) == 1  # past the failure budget (1): give up
    said = capsys.readouterr().err
    assert "preempted too many times" in said and "failure retries are spent" in said


def test_the_gcloud_runner_keeps_a_decided_stop_of_a_slice_that_left_active():
    """A slice that left ACTIVE took its hosts with it, but a host whose program had decided a stop reported it:
    the stop ends the launch (a preemption alone is retried: tests/test_infra_gcloud.py)."""
    plan = plan_for("--tpu_type", "v4-16", "--retries", "1", "--storage_retries", "1")
    fake = ScriptedGcloud(attempts=[[3, 255]], preempt_on_attempt=0)
    made, log = run_scripted(plan, fake)
    assert made == 3, log


def test_v4_16_is_the_two_host_slice_the_gcloud_cases_use():
    assert plan_for("--tpu_type", "v4-16").run.slice.hosts == 2


def test_storage_trouble_of_the_driver_itself_is_retried_as_storage_not_the_end_of_the_launch(capsys, monkeypatch):
    """Clearing the resize request before an attempt (the driver's own write beside the checkpoints) fails with the
    storage: exit 5's kind, on the storage budget, where it used to end the launch."""
    from levanter_mars.training.checkpointing import storage
    from levanter_mars.training.errors import StorageError
    from levanter_mars.training.run import resize

    class Down:
        def rm(self, path):
            raise ConnectionError("503 the storage is down")

    monkeypatch.setattr(storage, "fs_and_path", lambda path: (Down(), path))
    with pytest.raises(StorageError, match="cannot clear the resize request gs://b/run.resize.json"):
        resize.clear("gs://b/run.resize.json")
    tries = []

    def attempt(previous):
        tries.append(previous)
        resize.clear("gs://b/run.resize.json")

    assert pod.run_attempts(attempt, BUDGET) == 5  # storage budget 1: two attempts, then the storage's code
    assert [t.retry_kind for t in tries[1:]] == ["storage"]
    assert "503 the storage is down" in capsys.readouterr().err
