"""The run's lease (training/run/lease.py, lease_store.py): who may take a run, what a lease does on disk, and that of
N launches racing for it exactly one holds it (here on local disk; on the gs:// emulator: tests/test_gcs.py).

End to end (a live run refusing a second launch, a killed run's lease taken by its rerun, Ctrl-C releasing it):
tests/test_reliability.py.
"""

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from levanter_mars.training.errors import LeaseRecordError, RunLeasedError, StorageError, StoragePathError
from levanter_mars.training.run.lease import Holder, RunLease, decide, process_alive
from levanter_mars.training.run.lease_store import LocalStore, store_for
from tests.helpers.seeds import seeded_random
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
    "held, me, take_over, age_s, alive, take, why",
    [
        (None, _me(), False, 0, ALIVE, True, "no launch holds"),
        (_holder(), _me(), False, 10, ALIVE, False, "live elsewhere: pid 100 on host host-a (a plain command)"),
        (_holder(), _me(), True, 10, ALIVE, True, "--take_over true"),
        (_holder(launch_id="L1"), _me(launch_id="L1"), False, 10, ALIVE, True, "an earlier attempt of this launch"),
        (_holder(launch_id="L1"), _me(launch_id="L2"), False, 10, ALIVE, False, "(launch L1)"),
        (_holder(launch_id=None), _me(launch_id=None), False, 10, ALIVE, False, "live elsewhere"),  # no id: no launch
        (_holder(), _me(), False, 300, ALIVE, True, "lapsed"),
        (_holder(), _me(), False, 299, ALIVE, False, "lapses in 1 s"),
        (_holder(renewed_at=NOW - 10_000), _me(), False, 10, ALIVE, False, "renewed 10 s ago"),  # its clock: ignored
        (_holder(), _me(), False, 10, DEAD, True, "pid 100 on this machine, is gone"),
        (_holder(), _me(host="host-b"), False, 10, DEAD, False, "host host-a"),  # another machine: cannot be asked
        (_holder(), _me(pid_namespace="pid:[2]"), False, 10, DEAD, False, "live elsewhere"),  # another container
    ],
)
def test_who_may_take_the_run(held, me, take_over, age_s, alive, take, why):
    decision = decide(held, me, take_over=take_over, age_s=age_s, alive=alive)
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
        old.verify()  # before a checkpoint: a renewal conditional on the version it wrote
    with pytest.raises(RunLeasedError):
        old.check()
    assert not old.renew(), "a lost lease is never written again"
    old.release()
    assert json.loads((tmp_path / "run.lease.json").read_text())["token"] == new.holder.token
    new.release()
    assert not (tmp_path / "run.lease.json").exists()


def test_dead_lapsed_and_same_launch_holders_are_taken(tmp_path):
    path = tmp_path / "run.lease.json"
    me = Holder.this_process("run", "launch-1", time.time())
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for held, age_s in ((dataclasses.replace(me, token="dead", pid=int(finished.stdout)), 0),
                        (dataclasses.replace(me, token="lapsed", host="elsewhere", launch_id=None), 301),
                        (dataclasses.replace(me, token="retry", host="elsewhere"), 0)):  # fmt: skip
        path.write_bytes(held.to_bytes())
        os.utime(path, (time.time() - age_s, time.time() - age_s))  # as the storage stamped its last write
        lease = RunLease.acquire(str(path), "run", launch_id="launch-1")
        assert json.loads(path.read_text())["token"] == lease.holder.token
        lease.release()


def test_a_lapse_is_judged_by_the_storages_clock_not_the_writers(tmp_path):
    """A holder whose clock runs 10 minutes behind writes ``renewed_at`` far in the past: its lease is live as long as
    the storage says it was written recently; a holder whose clock runs ahead cannot keep a lease alive by it."""
    path = tmp_path / "run.lease.json"
    other = dataclasses.replace(Holder.this_process("run", None, time.time()), host="elsewhere", token="other")
    path.write_bytes(dataclasses.replace(other, renewed_at=time.time() - 600).to_bytes())
    with pytest.raises(RunLeasedError, match=r"renewed \d s ago, lapses in (29\d|300) s"):
        RunLease.acquire(str(path), "run")
    path.write_bytes(dataclasses.replace(other, renewed_at=time.time() + 600).to_bytes())
    os.utime(path, (time.time() - 400, time.time() - 400))
    RunLease.acquire(str(path), "run").release()


@pytest.mark.parametrize("content, why", [
    ("{", "it is not JSON"), ("[]", "not a JSON object"), (json.dumps({"token": "x"}), "it lacks run_id, launch_id"),
    ("", "it is not JSON"),
])  # fmt: skip
def test_a_record_this_program_did_not_write_is_refused_by_name_and_never_taken(tmp_path, content, why):
    path = tmp_path / "run.lease.json"
    path.write_text(content)
    for take_over in (False, True):
        with pytest.raises(LeaseRecordError, match=why) as refused:
            RunLease.acquire(str(path), "run", take_over=take_over)
        assert str(path) in str(refused.value) and "delete that file" in str(refused.value)
    assert path.read_text() == content


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
        assert json.loads(path.read_text())["token"] == thief.holder.token, "the old holder never overwrote it"
    finally:
        lease.release()
    thief.release()


def test_renewals_from_two_threads_at_once_never_take_the_lease_from_itself(tmp_path):
    """The renewal thread and a checkpoint's verify renew the same lease; two renewals that both start from the same
    version must not read each other's write as a take-over (seen on the local pod: a run stopped with exit 8,
    "another launch took the run over (now held by" its own pid)."""
    store = Delayed(LocalStore(str(tmp_path / "run.lease.json")), seeded_random("lease-self-race"))
    lease = RunLease.acquire(store.path, "run", store=store)
    start, results = threading.Barrier(4), []

    def renew_often():
        start.wait()
        results.extend(lease.renew() for _ in range(10))

    threads = [threading.Thread(target=renew_often) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [True] * 40 and lease.lost is None, lease.lost
    assert json.loads((tmp_path / "run.lease.json").read_text())["token"] == lease.holder.token
    lease.release()
    assert not (tmp_path / "run.lease.json").exists(), "its last version is the one it releases"


class _Failing:
    """A store whose operations fail (the storage service down) once ``down`` is set."""

    def __init__(self, store):
        self.store, self.path, self.down = store, store.path, False

    def __getattr__(self, name):
        operation = getattr(self.store, name)

        def maybe_failing(*args):
            if self.down:
                raise StorageError(f"the run's lease {self.path}: ServiceUnavailable: 503 the storage is down")
            return operation(*args)

        return maybe_failing


def test_a_run_whose_renewals_fail_for_half_the_ttl_stops_with_the_storage_code(tmp_path):
    store = _Failing(LocalStore(str(tmp_path / "run.lease.json")))
    lease = RunLease.acquire(store.path, "run", ttl_s=1.0, store=store)
    lease.start_renewing()
    try:
        store.down = True
        started, stopped = time.monotonic(), None
        while stopped is None and time.monotonic() - started < 30:
            try:
                lease.check()
            except StorageError as e:
                stopped = str(e)
            time.sleep(POLL_S)
        assert stopped is not None, "the run never stopped"
        # The last renewal that succeeded may have run up to ttl_s / 5 before the storage went down.
        assert time.monotonic() - started >= 0.5 - 0.2, "it stopped before half its TTL"
        assert "could not be renewed" in stopped and "503 the storage is down" in stopped
        with pytest.raises(StorageError):  # before a checkpoint, the renewal's own failure
            lease.verify()
    finally:
        store.down = False
        lease.release()


def test_storage_trouble_while_taking_the_lease_is_the_storage_code(tmp_path):
    store = _Failing(LocalStore(str(tmp_path / "run.lease.json")))
    store.down = True
    with pytest.raises(StorageError, match="503"):
        RunLease.acquire(store.path, "run", store=store)
    blocked = tmp_path / "a-file"
    blocked.write_text("in the way of the lease's directory")
    with pytest.raises(StoragePathError, match="run.lease.json"):  # no retry writes there: a config error
        RunLease.acquire(str(blocked / "run.lease.json"), "run")


class _LandedButLost:
    """A create that lands but whose answer is lost, as a retried request reads 412 for its own first try's write."""

    def __init__(self, store):
        self.store, self.path = store, store.path

    def __getattr__(self, name):
        return getattr(self.store, name)

    def create(self, data):
        self.store.create(data)
        return None


def test_a_write_that_landed_though_its_answer_was_lost_holds_the_run(tmp_path):
    store = _LandedButLost(LocalStore(str(tmp_path / "run.lease.json")))
    lease = RunLease.acquire(store.path, "run", store=store)
    assert json.loads((tmp_path / "run.lease.json").read_text())["token"] == lease.holder.token
    assert lease.renew()
    lease.release()
    assert not (tmp_path / "run.lease.json").exists()


class Delayed:
    """A store that waits a random moment (up to ``max_s``) before and after every operation: a slow disk, a bucket's
    latency, a thread descheduled between reading the record and writing it."""

    def __init__(self, store, rng, max_s=0.02):
        self.store, self.path, self._rng, self._max_s, self._lock = store, store.path, rng, max_s, threading.Lock()

    def _pause(self):
        with self._lock:
            wait = self._rng.uniform(0, self._max_s)
        time.sleep(wait)

    def __getattr__(self, name):
        operation = getattr(self.store, name)

        def delayed(*args):
            self._pause()
            try:
                return operation(*args)
            finally:
                self._pause()

        return delayed


def race(path: str, launches: int, rounds: int, name: str) -> list[int]:
    """``rounds`` times, ``launches`` threads take the lease at ``path`` at once, through delayed stores, and then
    release it; returns how many held it in each round, each checked against the record on the storage itself."""
    rng = seeded_random(name)
    held_per_round = []
    for _ in range(rounds):
        start = threading.Barrier(launches)
        won, refused, failed = [], [], []

        def launch():
            store = Delayed(store_for(path), rng)
            start.wait()
            try:
                won.append(RunLease.acquire(path, "run", store=store))
            except RunLeasedError as e:
                refused.append(str(e))
            except Exception as e:  # noqa: BLE001 - reported below
                failed.append(repr(e))

        threads = [threading.Thread(target=launch) for _ in range(launches)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failed, failed
        assert len(won) + len(refused) == launches
        assert all("live elsewhere" in r for r in refused), refused
        record = json.loads(store_for(path).read().data)  # the storage's own answer: who holds the run
        assert [w.holder.token for w in won] == [record["token"]], (record, [w.holder.token for w in won])
        held_per_round.append(len(won))
        for lease in won:
            lease.release()
        assert store_for(path).read() is None
    return held_per_round


def test_of_n_launches_racing_on_local_disk_exactly_one_holds_the_run(tmp_path):
    """8 launches (threads: flock excludes each open of the lock file, so threads exclude each other as processes
    do) take the same lease at once, 5 times over, with random delays around every read and write."""
    held = race(str(tmp_path / "run.lease.json"), launches=8, rounds=5, name="lease-race-local")
    print(f"8 concurrent acquires on local disk, 5 rounds: held by {held}")
    assert held == [1] * 5
