"""One live launch per run: the run's lease.

Two launches of one run id (the same command started again while the first still trains, a relaunch while an old pod
job is not yet stopped) would both resume from the same checkpoint, interleave their rows in ``metrics.jsonl`` and
overwrite each other's ``step-N``. So process 0 holds a lease, a small JSON beside the checkpoint directory (local or
``gs://``, where every host and every later launch sees it), before anything of the run is touched:

* it takes the lease when there is none, when the holder's lease has lapsed (not renewed for ``ttl_s`` by the
  storage's clock), when the holder is an earlier attempt of the same launch (``$LEVANTER_MARS_LAUNCH_ID``: the
  launcher's retry), when the holder ran on this machine and its process is gone, or with ``--take_over true``;
* otherwise it refuses, naming the holder (exit 8, nothing written); a record this program did not write (not JSON, a
  field missing) is never taken: it is refused naming the file (exit 2);
* it renews the lease every ``ttl_s / 5`` from a thread, and renews it before every checkpoint; a renewal that finds
  the record taken over stops the run at its next step (exit 8: this launch no longer owns the run), and renewals that
  fail for half of ``ttl_s`` stop it too (exit 5: the storage), before the lease could lapse and be taken while this
  launch still writes; it releases the lease at the end.

Taking and renewing cannot both succeed for two launches (``lease_store.py``): a lease is created only where there is
none (an exclusive create), and replaced or released only if it is still the version this launch read (a lock on
local disk, a generation precondition on gs://). Of N launches that race, exactly one holds the run; the others read
its record and refuse. A lapse is judged by the storage's clock, never by comparing two machines' clocks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from typing import Callable, Optional

import psutil

from levanter_mars.training import distributed
from levanter_mars.training.errors import LeaseRecordError, RunLeasedError, StorageError
from levanter_mars.training.run.identity import checkpoint_dir
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV
from levanter_mars.training.run.lease_store import LeaseStore, Version, store_for

logger = logging.getLogger(__name__)

LEASE_SUFFIX = ".lease.json"
#: A holder that has not renewed for this long is taken for dead (a pod's host cannot be asked whether it lives).
TTL_S = 300.0
#: Reads and writes of one take before giving up on a record that changes under every try.
_TRIES = 10


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds the lease: the process, where it runs, and when it last said it lives (``renewed_at``: its own clock,
    for people; a lapse is judged by the storage's time of the record's last write)."""

    token: str
    run_id: str
    launch_id: Optional[str]
    host: str
    pid_namespace: str
    pid: int
    process_started: float
    renewed_at: float
    ttl_s: float

    @classmethod
    def this_process(cls, run_id: str, launch_id: Optional[str], now: float, ttl_s: float = TTL_S) -> "Holder":
        return cls(token=uuid.uuid4().hex, run_id=run_id, launch_id=launch_id, host=socket.gethostname(),
                   pid_namespace=_pid_namespace(), pid=os.getpid(), process_started=psutil.Process().create_time(),
                   renewed_at=now, ttl_s=ttl_s)  # fmt: skip

    @classmethod
    def parse(cls, data: bytes, path: str) -> "Holder":
        """The holder a record names; raises LeaseRecordError naming ``path`` and what is wrong with it."""
        try:
            value = json.loads(data)
        except ValueError as e:
            raise _unreadable(path, f"it is not JSON ({e})") from None
        if not isinstance(value, dict):
            raise _unreadable(path, "it is not a JSON object")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in value]
        if missing:
            raise _unreadable(path, f"it lacks {', '.join(missing)}")
        holder = cls(**{f.name: value[f.name] for f in dataclasses.fields(cls)})
        if not isinstance(holder.ttl_s, (int, float)) or not isinstance(holder.token, str):
            raise _unreadable(path, "its token or ttl_s is of the wrong type")
        return holder

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    def same_machine(self, other: "Holder") -> bool:
        return (self.host, self.pid_namespace) == (other.host, other.pid_namespace)

    def who(self) -> str:
        launch = f"launch {self.launch_id}" if self.launch_id else "a plain command"
        return f"pid {self.pid} on host {self.host} ({launch})"

    def describe(self, age_s: float) -> str:
        """``age_s``: the storage's seconds since the record was last written."""
        return f"{self.who()}, renewed {age_s:.0f} s ago, lapses in {max(0.0, self.ttl_s - age_s):.0f} s"


def _unreadable(path: str, why: str) -> LeaseRecordError:
    return LeaseRecordError(
        f"the run's lease {path} holds no lease record of this program: {why}. It is never taken: if no launch holds "
        f"the run, delete that file."
    )


@dataclasses.dataclass(frozen=True)
class Decision:
    take: bool
    why: str


def decide(held: Optional[Holder], me: Holder, *, take_over: bool, age_s: float,
           alive: Callable[[Holder], bool]) -> Decision:  # fmt: skip
    """Whether ``me`` may take the run from ``held``, whose record the storage last wrote ``age_s`` seconds ago
    (``alive`` asks whether a holder on this machine still runs)."""
    if held is None:
        return Decision(True, "no launch holds the run")
    if held.token == me.token:
        return Decision(True, "this process holds the run")
    if me.launch_id is not None and held.launch_id == me.launch_id:
        return Decision(True, f"an earlier attempt of this launch held it ({held.describe(age_s)})")
    if age_s >= held.ttl_s:
        return Decision(True, f"its holder's lease lapsed ({held.describe(age_s)})")
    if held.same_machine(me) and not alive(held):
        return Decision(True, f"its holder, pid {held.pid} on this machine, is gone")
    if take_over:
        return Decision(True, f"--take_over true, from {held.describe(age_s)}")
    return Decision(False, f"the run is live elsewhere: {held.describe(age_s)}")


def process_alive(holder: Holder) -> bool:
    """Whether ``holder``'s process (on this machine) still runs: the same pid, started at the same time, no zombie."""
    try:
        process = psutil.Process(holder.pid)
        if abs(process.create_time() - holder.process_started) > 1.0:
            return False  # the pid was reused
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


class RunLease:
    """The lease this process holds on a run (see the module docstring)."""

    def __init__(self, store: LeaseStore, holder: Holder, generation: str):
        self.store = store
        self.path = store.path
        self.holder = holder
        self.generation = generation
        self.lost: Optional[str] = None
        """Why the run is no longer this launch's (another launch took it over), once a renewal found it."""
        self._renewed = time.monotonic()  # the last renewal that succeeded (this machine's clock: a duration)
        self._renewal_error: Optional[str] = None
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def acquire(cls, path: str, run_id: str, *, take_over: bool = False, launch_id: Optional[str] = None,
                ttl_s: float = TTL_S, alive: Callable[[Holder], bool] = process_alive,
                store: Optional[LeaseStore] = None) -> "RunLease":  # fmt: skip
        """Takes the lease at ``path`` or raises RunLeasedError naming the holder, having written nothing.
        ``store``: where the record lives (default: by ``path``, ``lease_store.store_for``)."""
        store = store or store_for(path)
        me = Holder.this_process(run_id, launch_id, time.time(), ttl_s)
        mine = me.to_bytes()
        first_seen: Optional[str] = None  # --take_over is for the holder this launch saw, not a launch racing it
        for _ in range(_TRIES):
            current = store.read()
            if current is None:
                generation = store.create(mine)
                if generation is not None or _is_mine(store.read(), me):  # a retried write may have landed
                    return cls._taken(store, me, generation, "no launch holds the run")
                continue  # another launch created it first: judge its record
            held = Holder.parse(current.data, store.path)
            first_seen = first_seen or held.token
            age_s = store.now() - current.written_at
            decision = decide(held, me, take_over=take_over and held.token == first_seen, age_s=age_s, alive=alive)
            if not decision.take:
                raise RunLeasedError(
                    f"{run_id}: {decision.why} ({store.path}). Nothing was written. If that process is dead, wait "
                    f"for its lease to lapse or pass --take_over true."
                )
            generation = store.replace(mine, current.generation)
            if generation is not None or _is_mine(store.read(), me):
                return cls._taken(store, me, generation, decision.why)
        raise RunLeasedError(f"{run_id}: the run's lease {store.path} changed under each of {_TRIES} tries to take it "
                             "(launches racing for it); nothing was written")  # fmt: skip

    @classmethod
    def _taken(cls, store: LeaseStore, me: Holder, generation: Optional[str], why: str) -> "RunLease":
        if generation is None:
            generation = store.read().generation
        if why != "no launch holds the run":
            logger.warning("%s: took the run's lease: %s", me.run_id, why)
        return cls(store, me, generation)

    def renew(self) -> bool:
        """Writes a fresh ``renewed_at`` if the lease is still the version this launch wrote; else marks it lost.
        Returns whether it is held. Raises StorageError if the storage fails."""
        with self._renewing:  # the renewal thread and a checkpoint's verify: one at a time, each from the last version
            if self.lost is not None:
                return False
            renewed = dataclasses.replace(self.holder, renewed_at=time.time())
            generation = self.store.replace(renewed.to_bytes(), self.generation)
            if generation is None:
                current = self.store.read()
                if not _is_mine(current, renewed):  # not even a retried write of this renewal that landed
                    held = _holder_or_none(current, self.store.path)
                    who = "its lease is gone" if held is None else f"now held by {held.who()}"
                    self.lost = f"another launch took the run over ({who}, {self.path})"
                    return False
                generation, renewed = current.generation, Holder.parse(current.data, self.store.path)
            self.holder, self.generation = renewed, generation
            self._renewed, self._renewal_error = time.monotonic(), None
            return True

    def check(self) -> None:
        """Raises RunLeasedError if a renewal found the run taken over, StorageError if none has succeeded for half
        the TTL (cheap: every step; reads no storage)."""
        if self.lost is not None:
            raise RunLeasedError(f"{self.holder.run_id}: {self.lost}; this launch stops without writing more")
        failing_s = time.monotonic() - self._renewed
        if failing_s >= self.holder.ttl_s / 2:
            raise StorageError(
                f"{self.holder.run_id}: the run's lease {self.path} could not be renewed for {failing_s:.0f} s, half "
                f"its TTL ({self._renewal_error or 'the renewal did not return'}); this launch stops before the lease "
                "can lapse and another launch take the run while it writes"
            )

    def verify(self) -> None:
        """Renews the lease now (before a checkpoint): raises RunLeasedError unless it is still this launch's,
        StorageError if the storage fails."""
        if not self.renew():
            self.check()

    def start_renewing(self) -> None:
        def loop():
            while not self._stop.wait(self.holder.ttl_s / 5):
                try:
                    if not self.renew():
                        return
                except Exception as e:  # noqa: BLE001 - the lease lapses only after ttl_s; check() stops at half of it
                    self._renewal_error = f"{type(e).__name__}: {e}"
                    logger.warning("could not renew the run's lease: %s", self._renewal_error)

        self._thread = threading.Thread(target=loop, name="run-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stops renewing and deletes the lease if it is still the version this launch wrote."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost is not None:
            return
        try:
            self.store.delete(self.generation)
        except StorageError as e:  # a lease left behind lapses; the run's outcome stands
            logger.warning("could not release the run's lease: %s", e)


def _holder_or_none(version: Optional[Version], path: str) -> Optional[Holder]:
    if version is None:
        return None
    try:
        return Holder.parse(version.data, path)
    except LeaseRecordError:
        return None


def _is_mine(version: Optional[Version], me: Holder) -> bool:
    """Whether the record is ``me``'s: its token (new at every take) is, whatever its renewal time says."""
    held = _holder_or_none(version, "")
    return held is not None and held.token == me.token


def lease_path(config) -> str:
    """Beside the run's checkpoint directory, named by the run where that directory is a base path other runs share,
    and never inside it (``fresh=true`` moves the directory aside; the lease stays)."""
    ckpt = checkpoint_dir(config).rstrip("/")
    if config.trainer.checkpointer.append_run_id_to_base_path:
        return ckpt + LEASE_SUFFIX
    return posixpath.join(ckpt, config.trainer.id + LEASE_SUFFIX)


def acquire_for(config) -> Optional[RunLease]:
    """Process 0 takes the run's lease and starts renewing it (every process raises its refusal). Returns the lease on
    process 0, None elsewhere."""
    taken: list[RunLease] = []

    def take() -> None:
        lease = RunLease.acquire(lease_path(config), config.trainer.id, take_over=config.take_over,
                                 launch_id=os.environ.get(LAUNCH_ID_ENV))  # fmt: skip
        lease.start_renewing()
        taken.append(lease)

    distributed.leader_decides(take)
    return taken[0] if taken else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
