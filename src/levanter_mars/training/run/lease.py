"""One live launch per run: the run's lease.

Two launches of one run id (the same command started again while the first still trains, a relaunch while an old pod
job is not yet stopped) would both resume from the same checkpoint, interleave their rows in ``metrics.jsonl`` and
overwrite each other's ``step-N``. So process 0 holds a lease, a small JSON beside the checkpoint directory (local or
``gs://``, where every host and every later launch sees it), before anything of the run is touched:

* it takes the lease when there is none, when the holder's lease has lapsed (not renewed for ``ttl_s``), when the
  holder is an earlier attempt of the same launch (``$LEVANTER_MARS_LAUNCH_ID``: the launcher's retry), when the holder
  ran on this machine and its process is gone, or with ``--take_over true``;
* otherwise it refuses, naming the holder (exit 2, nothing written);
* it renews the lease every ``ttl_s / 5`` from a thread, checks it before every checkpoint and stops at the next step
  if another launch took it over (exit 2: this launch no longer owns the run), and releases it at the end.

Taking is write, settle, read back: of two launches that race, both read the last writer's token and only one goes on.
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
from levanter_mars.training.checkpointing.storage import fs_and_path, is_local
from levanter_mars.training.errors import RunLeasedError
from levanter_mars.training.run.identity import checkpoint_dir
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV
from levanter_mars.training.whole_files import write_whole

logger = logging.getLogger(__name__)

LEASE_SUFFIX = ".lease.json"
#: A holder that has not renewed for this long is taken for dead (a pod's host cannot be asked whether it lives).
TTL_S = 300.0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds the lease: the process, where it runs, and when it last said it lives."""

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
    def from_json(cls, value) -> Optional["Holder"]:
        try:
            return cls(**{f.name: value[f.name] for f in dataclasses.fields(cls)})
        except (TypeError, KeyError):
            return None  # not a lease this code wrote: taken as none

    def same_machine(self, other: "Holder") -> bool:
        return (self.host, self.pid_namespace) == (other.host, other.pid_namespace)

    def describe(self, now: float) -> str:
        launch = f"launch {self.launch_id}" if self.launch_id else "a plain command"
        return (f"pid {self.pid} on host {self.host} ({launch}), renewed {now - self.renewed_at:.0f} s ago, "
                f"lapses in {max(0.0, self.renewed_at + self.ttl_s - now):.0f} s")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Decision:
    take: bool
    why: str


def decide(held: Optional[Holder], me: Holder, *, take_over: bool, now: float,
           alive: Callable[[Holder], bool]) -> Decision:  # fmt: skip
    """Whether ``me`` may take the run from ``held`` (``alive`` asks whether a holder on this machine still runs)."""
    if held is None:
        return Decision(True, "no launch holds the run")
    if held.token == me.token:
        return Decision(True, "this process holds the run")
    if me.launch_id is not None and held.launch_id == me.launch_id:
        return Decision(True, f"an earlier attempt of this launch held it ({held.describe(now)})")
    if now >= held.renewed_at + held.ttl_s:
        return Decision(True, f"its holder's lease lapsed ({held.describe(now)})")
    if held.same_machine(me) and not alive(held):
        return Decision(True, f"its holder, pid {held.pid} on this machine, is gone")
    if take_over:
        return Decision(True, f"--take_over true, from {held.describe(now)}")
    return Decision(False, f"the run is live elsewhere: {held.describe(now)}")


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

    def __init__(self, path: str, holder: Holder):
        self.path = path
        self.holder = holder
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def acquire(cls, path: str, run_id: str, *, take_over: bool = False, launch_id: Optional[str] = None,
                ttl_s: float = TTL_S, alive: Callable[[Holder], bool] = process_alive) -> "RunLease":  # fmt: skip
        """Takes the lease at ``path`` or raises RunLeasedError naming the holder, having written nothing."""
        now = time.time()
        me = Holder.this_process(run_id, launch_id, now, ttl_s)
        decision = decide(_read(path), me, take_over=take_over, now=now, alive=alive)
        if not decision.take:
            raise RunLeasedError(
                f"{run_id}: {decision.why} ({path}). Nothing was written. If that process is dead, wait for its "
                f"lease to lapse or pass --take_over true."
            )
        lease = cls(path, me)
        lease._write()
        time.sleep(_settle_s(path))  # a racing launch's write lands before we read back
        winner = _read(path)
        if winner is None or winner.token != me.token:
            raise RunLeasedError(
                f"{run_id}: another launch took the run at the same time"
                f"{'' if winner is None else ' (' + winner.describe(time.time()) + ')'} ({path}). Nothing was written."
            )
        if decision.why != "no launch holds the run":
            logger.warning("%s: took the run's lease: %s", run_id, decision.why)
        return lease

    def still_held(self) -> bool:
        held = _read(self.path)
        return held is not None and held.token == self.holder.token

    def renew(self) -> bool:
        """Writes a fresh ``renewed_at`` if the lease is still ours; else marks it lost. Returns whether held."""
        if self.lost is None and not self.still_held():
            self.lost = f"another launch took the run over ({_describe(_read(self.path))}, {self.path})"
        if self.lost is not None:
            return False
        self.holder = dataclasses.replace(self.holder, renewed_at=time.time())
        self._write()
        return True

    def check(self) -> None:
        """Raises RunLeasedError if the renewal found the run taken over (cheap: every step)."""
        if self.lost is not None:
            raise RunLeasedError(f"{self.holder.run_id}: {self.lost}; this launch stops without writing more")

    def verify(self) -> None:
        """Reads the lease now (before a checkpoint) and raises RunLeasedError unless it is still ours."""
        if not self.renew():
            self.check()

    def start_renewing(self) -> None:
        def loop():
            while not self._stop.wait(self.holder.ttl_s / 5):
                try:
                    if not self.renew():
                        return
                except Exception as e:  # noqa: BLE001 - storage hiccups: the lease lapses only after ttl_s
                    logger.warning("could not renew the run's lease %s: %s", self.path, e)

        self._thread = threading.Thread(target=loop, name="run-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stops renewing and deletes the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self.still_held():
                fs, plain = fs_and_path(self.path)
                fs.rm(plain)
        except Exception as e:  # noqa: BLE001 - a lease left behind lapses; the run's outcome stands
            logger.warning("could not release the run's lease %s: %s", self.path, e)

    def _write(self) -> None:
        write_whole(self.path, json.dumps(dataclasses.asdict(self.holder), indent=1))  # never read torn: "no holder"


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


def _read(path: str) -> Optional[Holder]:
    fs, plain = fs_and_path(path)
    try:
        with fs.open(plain, "r") as f:
            return Holder.from_json(json.load(f))
    except (FileNotFoundError, ValueError):
        return None


def _describe(holder: Optional[Holder]) -> str:
    return "its lease is gone" if holder is None else holder.describe(time.time())


def _settle_s(path: str) -> float:
    fs, _ = fs_and_path(path)
    return 0.05 if is_local(fs) else 1.0


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
