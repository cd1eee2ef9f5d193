"""The run's lease (training/run/lease.py): who may take a run, and what a lease does on disk.

End to end (a live run refusing a second launch, a killed run's lease taken by its rerun): tests/test_reliability.py;
on gs://: tests/test_gcs.py.
"""

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from levanter_mars.training.errors import RunLeasedError
from levanter_mars.training.run.lease import Holder, RunLease, decide, process_alive
from tests.helpers.training import POLL_S

NOW = 1_000_000.0


def _holder(**changes) -> Holder:
    base = Holder(token="held", run_id="run", launch_id=None, host="host-a", pid_namespace="pid:[1]", pid=100,
                  process_started=5.0, renewed_at=NOW - 10, ttl_s=300.0)  # fmt: skip
    return dataclasses.replace(base, **changes)


def _me(**changes) -> Holder:
    return _holder(token="mine", pid=200, renewed_at=NOW, **changes)


ALIVE, DEAD = (lambda holder: True), (lambda holder: False)


@pytest.mark.parametrize(
    "held, me, take_over, alive, take, why",
    [
        (None, _me(), False, ALIVE, True, "no launch holds"),
        (_holder(), _me(), False, ALIVE, False, "live elsewhere: pid 100 on host host-a (a plain command)"),
        (_holder(), _me(), True, ALIVE, True, "--take_over true"),
        (_holder(launch_id="L1"), _me(launch_id="L1"), False, ALIVE, True, "an earlier attempt of this launch"),
        (_holder(launch_id="L1"), _me(launch_id="L2"), False, ALIVE, False, "(launch L1)"),
        (_holder(launch_id=None), _me(launch_id=None), False, ALIVE, False, "live elsewhere"),  # no id: no launch
        (_holder(renewed_at=NOW - 300), _me(), False, ALIVE, True, "lapsed"),
        (_holder(renewed_at=NOW - 299), _me(), False, ALIVE, False, "lapses in 1 s"),
        (_holder(), _me(), False, DEAD, True, "pid 100 on this machine, is gone"),
        (_holder(), _me(host="host-b"), False, DEAD, False, "host host-a"),  # another machine: cannot be asked
        (_holder(), _me(pid_namespace="pid:[2]"), False, DEAD, False, "live elsewhere"),  # another container
    ],
)
def test_who_may_take_the_run(held, me, take_over, alive, take, why):
    decision = decide(held, me, take_over=take_over, now=NOW, alive=alive)
    assert (decision.take, why in decision.why) == (take, True), decision


def test_a_process_is_alive_only_as_itself():
    me = Holder.this_process("run", None, time.time())
    assert process_alive(me)
    assert not process_alive(dataclasses.replace(me, process_started=me.process_started - 100))  # a reused pid
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not process_alive(dataclasses.replace(me, pid=int(finished.stdout)))


def test_a_live_lease_is_refused_naming_its_holder_and_nothing_is_written(tmp_path):
    path = str(tmp_path / "run.lease.json")
    first = RunLease.acquire(path, "run")
    written = (tmp_path / "run.lease.json").read_bytes()
    with pytest.raises(RunLeasedError) as refused:
        RunLease.acquire(path, "run")  # this very process holds it: alive, on this machine
    message = str(refused.value)
    assert "the run is live elsewhere" in message and f"pid {first.holder.pid}" in message
    assert "--take_over true" in message and path in message
    assert (tmp_path / "run.lease.json").read_bytes() == written
    first.release()
    assert not (tmp_path / "run.lease.json").exists()


def test_a_taken_over_lease_stops_its_old_holder_and_is_not_released_by_it(tmp_path):
    path = str(tmp_path / "run.lease.json")
    old = RunLease.acquire(path, "run")
    new = RunLease.acquire(path, "run", take_over=True)
    old.check()  # nothing known yet: the check every step reads no storage
    with pytest.raises(RunLeasedError, match="another launch took the run over"):
        old.verify()  # before a checkpoint: reads the lease
    with pytest.raises(RunLeasedError):
        old.check()
    assert not old.renew(), "a lost lease is never written again"
    old.release()
    assert new.still_held()
    new.release()
    assert not (tmp_path / "run.lease.json").exists()


def test_dead_lapsed_and_same_launch_holders_are_taken(tmp_path):
    path = tmp_path / "run.lease.json"
    me = Holder.this_process("run", "launch-1", time.time())
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for held in (dataclasses.replace(me, token="dead", pid=int(finished.stdout)),
                 dataclasses.replace(me, token="lapsed", host="elsewhere", renewed_at=time.time() - 301),
                 dataclasses.replace(me, token="retry", host="elsewhere")):  # fmt: skip
        path.write_text(json.dumps(dataclasses.asdict(held)))
        lease = RunLease.acquire(str(path), "run", launch_id="launch-1")
        assert json.loads(path.read_text())["token"] == lease.holder.token
        lease.release()


def test_the_renewal_keeps_the_lease_fresh_and_finds_a_take_over(tmp_path):
    path = tmp_path / "run.lease.json"
    lease = RunLease.acquire(str(path), "run", ttl_s=0.5)
    first = json.loads(path.read_text())["renewed_at"]
    lease.start_renewing()
    try:
        deadline = time.time() + 30
        while json.loads(path.read_text())["renewed_at"] == first and time.time() < deadline:
            time.sleep(POLL_S)
        assert json.loads(path.read_text())["renewed_at"] > first
        thief = RunLease.acquire(str(path), "run", take_over=True)
        while lease.lost is None and time.time() < deadline:
            time.sleep(POLL_S)
        with pytest.raises(RunLeasedError, match="took the run over"):
            lease.check()
        assert thief.still_held(), "the old holder's renewal never overwrites the new one"
    finally:
        lease.release()
    thief.release()


def test_a_foreign_or_torn_lease_file_reads_as_no_holder(tmp_path):
    path = tmp_path / "run.lease.json"
    for content in ("{", json.dumps({"token": "x"})):
        path.write_text(content)
        RunLease.acquire(str(path), "run").release()
