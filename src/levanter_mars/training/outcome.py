"""One outcome policy for every launcher: from how each host's training process ended to what the launch does next.

Every launcher (the Ray job's driver, on a TPU pod or the local pod, and the plain-gcloud runner) and pre-flight's
check pass the exits of an attempt's hosts here, in process order, and act on the :class:`Verdict`:

* **done**: every host exited 0.
* **stop, interrupted** (130): a person interrupted the run (Ctrl-C; a process that died of SIGINT reads the same),
  whatever the other hosts did: never retried.
* **stop** with the run's own code: the run decided to stop (``training/errors.py``: a config error, a non-finite stop,
  exhausted data, a failed eval, the run live elsewhere), which a retry would repeat. A decided code wins over a
  peer's crash or signal, which it causes (process 0 decides for every host, then the others are torn down), and over
  a lost host (a slice lost while, or after, the run decided). Hosts that decided *different* codes are no decision:
  the launch gives up, naming them.
* **retry** what can succeed on a retry: a crash (exit 1), a process ended by a signal (an out-of-memory kill reads
  as one), a lost host (a preemption), a failure of the cluster to run the attempt at all (:data:`NOT_RUN`: Ray's
  errors other than a preemption, on the failure budget); and, a bounded number of times, unusable storage (exit 5),
  which a hiccup of the storage service at an attempt's start makes as surely as a full disk does. Each kind has its
  budget (:class:`RetryBudget`); past it, the launch gives up.
* **retry at once, as a preemption**: a preemption notice (SIGTERM) reached a host and every host saved the same
  step and stopped (exit 9, ``training/preemption.py``; a peer torn down after it reads the same). Budgeted as a
  preemption, not a failure.
* **retry at once on another slice count** (``resize``): the launcher asked the run to stop at its next checkpoint
  because slices came back (``training/run/resize.py``), and it did (exit 7 on every host, or on process 0 with its
  peers torn down after it). Budgeted like preemptions: each is a slice count's change.
* **give up**: a code below 128 the training program never exits with (126, 127: a broken image or command) is not
  retried; nor is anything past its budget.

Light on purpose: the Ray host task and the launchers import it without JAX.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from levanter_mars.training.errors import ASKED_STOPS, DECIDED_STOPS, ExitCode, describe_exit

#: The kinds of retry, each with its own budget.
FAILURE, PREEMPTION, STORAGE, RESIZE = "failure", "preemption", "storage", "resize"
#: A host lost with its training process (a preempted VM, a dead Ray worker): no exit code.
LOST = None
#: The cluster could not run the attempt's host at all (Ray's error that is no preemption: a TpuRunError): a failure.
NOT_RUN = "not run"
#: Exit codes from 128 up are a shell's or a container's report of a process killed by a signal (128 + N: 137 is an
#: out-of-memory kill) or of a lost connection (ssh's 255): crashes, retried, like a negative code (``subprocess``'s).
KILLED_BY_SIGNAL = 128


@dataclass(frozen=True)
class RetryBudget:
    failure: int = 3
    preemption: int = 100
    storage: int = 2
    resize: int = 100

    def allows(self, kind: str, used: Mapping[str, int]) -> bool:
        return used.get(kind, 0) < getattr(self, kind)


@dataclass(frozen=True)
class Verdict:
    action: str
    """``done``, ``stop``, ``retry`` or ``give_up``."""
    exit_code: int
    """The launch's exit code if it ends now: 0, the run's own code, or 1."""
    reason: str
    retry_kind: Optional[str] = None
    """For ``retry``: which budget the retry draws on."""
    exits: tuple = field(default=())

    @property
    def ends(self) -> bool:
        return self.action != "retry"


def describe(code) -> str:
    if code is LOST:
        return "host lost"
    return "not run by the cluster" if code == NOT_RUN else describe_exit(code)


def _interrupted(code) -> bool:
    return code == ExitCode.INTERRUPTED or code == -signal.SIGINT


def judge(exits: Sequence[Optional[int]], budget: RetryBudget = RetryBudget(),
          used: Optional[Mapping[str, int]] = None) -> Verdict:  # fmt: skip
    """The launch's verdict on an attempt whose hosts (process 0 first) ended with ``exits`` (a code; a negative code
    is a signal; ``None`` a lost host; :data:`NOT_RUN` a host the cluster could not run), given the retries ``used``
    so far of each kind."""
    used = dict(used or {})
    exits = tuple(exits)
    said = ", ".join(f"process {i}: {describe(c)}" for i, c in enumerate(exits))
    if exits and all(c == ExitCode.DONE for c in exits):
        return Verdict("done", ExitCode.DONE, f"every host finished ({said})", exits=exits)
    if any(_interrupted(c) for c in exits):
        return Verdict("stop", ExitCode.INTERRUPTED, f"a person interrupted the run ({said}); not retried",
                       exits=exits)  # fmt: skip
    decided = sorted({c for c in exits if c in DECIDED_STOPS})
    if len(decided) > 1:
        return Verdict("give_up", ExitCode.CRASH, f"the hosts decided different stops ({said}): no decision of the "
                       "run; not retried", exits=exits)  # fmt: skip
    if decided and decided[0] != ExitCode.CHECKPOINT_STORAGE:
        code = decided[0]
        return Verdict("stop", code, f"the run stopped with {describe_exit(code)} ({said}); not retried: a retry runs "
                       "the same config on the same data and stops the same way", exits=exits)  # fmt: skip
    codes = [c for c in exits if c is not LOST and c != NOT_RUN]
    unknown = sorted({c for c in codes if 0 < c < KILLED_BY_SIGNAL and c not in set(ExitCode)})
    if unknown:
        return Verdict("give_up", ExitCode.CRASH, f"{describe_exit(unknown[0])} is no exit code of the training "
                       f"program (a broken image or command?) ({said}); not retried", exits=exits)  # fmt: skip
    if decided:  # unusable storage: often a passing failure of the storage service
        kind, what = STORAGE, "storage unusable"
    elif any(c == ExitCode.PREEMPTED for c in exits):
        kind, what = PREEMPTION, "the run was preempted (it saved what it could, exit 9)"
    elif any(c in ASKED_STOPS for c in exits):
        kind, what = RESIZE, "the run stopped at a checkpoint to change its slice count, as asked"
    elif any(c is LOST for c in exits):
        kind, what = PREEMPTION, "a host was lost"
    elif any(c == NOT_RUN for c in exits):
        kind, what = FAILURE, "the cluster could not run the attempt"
    else:
        kind, what = FAILURE, "a host crashed or was killed"
    if not budget.allows(kind, used):
        final = ExitCode.CHECKPOINT_STORAGE if kind == STORAGE else ExitCode.CRASH
        return Verdict("give_up", final, f"{what} ({said}), and the {kind} retries are spent "
                       f"({used.get(kind, 0)} of {getattr(budget, kind)})", exits=exits)  # fmt: skip
    return Verdict("retry", ExitCode.CRASH, f"{what} ({said}): retried ({kind} {used.get(kind, 0) + 1} of "
                   f"{getattr(budget, kind)})", retry_kind=kind, exits=exits)  # fmt: skip


def signal_exit(name: str) -> int:
    """The exit of a process ended by signal ``name`` (``"SIGTERM"``), as ``subprocess`` reports it."""
    return -int(getattr(signal, name))
