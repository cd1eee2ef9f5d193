"""Why a run stops, and the exit code that says so.

Each error is raised on every process alike (process 0's decisions reach the others through
:func:`~levanter_mars.training.distributed.leader_decides`), and the entry point maps it to an exit code. Every
launcher judges its hosts' codes by one policy (``training/outcome.py``): it retries a crash (1, or a process killed by
a signal), a lost host and a preemption (exit 9, or a host lost), unusable storage a bounded number of times, and ends the launch with the code
the run decided otherwise, which it then exits with itself. A person's interrupt (130) is never retried.

| code | meaning | retried by a launcher |
| --- | --- | --- |
| 0 | done (or already complete) | - |
| 1 | crash: an error the run did not decide (a bug, a lost peer, an out-of-memory kill reads as a signal) | yes |
| 2 | config error: nothing was trained; the message names the field or file (a storage path no retry can write: a file in the way, no permission, read-only; a checkpoint from another optimizer or model config; a lease record no launch of this program wrote) | no |
| 3 | non-finite stop: a NaN/Inf with `trainer.nonfinite: stop`, or too many skipped steps in a row | no |
| 4 | data exhausted before `trainer.num_train_steps` (the last checkpoint was saved) | no |
| 5 | storage unusable: a checkpoint, the run's lease or a resize request cannot be written or read (disk full, the storage service failing), or the lease could not be renewed for half its TTL | `storage_retries` times (2) |
| 6 | eval failed, with `eval_harness_failure: stop` (the default, `continue`, logs it and trains on) | no |
| 7 | resize: the launcher asked the run to stop at its next checkpoint (slices came back, `training/run/resize.py`), and it did | at once, on the new slice count |
| 8 | the run is live elsewhere: another launch holds its lease (refused before anything is written), or took it over (this launch stopped at its next step) (`training/run/lease.py`) | no |
| 9 | preempted, saved at step N: a preemption notice (SIGTERM to any host) made every host save the same step and stop (`training/preemption.py`); a save that could not finish within `trainer.preemption_grace_s` leaves the previous checkpoint the resume point | at once, as a preemption |
| 130 | interrupted by a person (Ctrl-C: SIGINT), no traceback; the lease is released | no |

Light on purpose: the Ray host task imports this module, and must not import JAX.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    DONE = 0
    CRASH = 1
    CONFIG_ERROR = 2
    NONFINITE_STOP = 3
    DATA_EXHAUSTED = 4
    CHECKPOINT_STORAGE = 5
    EVAL_FAILED = 6
    RESIZE = 7
    LIVE_ELSEWHERE = 8
    PREEMPTED = 9
    INTERRUPTED = 130


#: Codes of runs that stopped because the launcher or the cluster asked them to (not the run's decision, not a
#: failure).
ASKED_STOPS = frozenset({ExitCode.RESIZE, ExitCode.PREEMPTED})


#: Codes of runs that ended for a reason they report (``training/outcome.py`` says which a launcher retries).
DECIDED_STOPS = frozenset(code for code in ExitCode if code not in (ExitCode.DONE, ExitCode.CRASH, *ASKED_STOPS))


def describe_exit(code: int) -> str:
    """``"exit 3 (non-finite stop)"``, ``"signal SIGKILL"``: for logs and the goodput record."""
    import signal

    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    try:
        return f"exit {code} ({ExitCode(code).name.lower().replace('_', ' ')})"
    except ValueError:
        return f"exit {code}"


_shared_errors: dict[str, type[Exception]] = {}


def shared_error(cls: type[Exception]) -> type[Exception]:
    """Registers an error class that process 0 may raise while deciding for every host: the others raise it too."""
    _shared_errors[cls.__name__] = cls
    return cls


def shared_error_class(name: str) -> type[Exception]:
    return _shared_errors.get(name, RuntimeError)


@shared_error
class NonFiniteTrainingError(RuntimeError):
    """Training stopped because of a NaN/Inf; the last checkpoint is finite."""


@shared_error
class DataExhaustedError(RuntimeError):
    """The training data ran out before ``num_train_steps``."""


@shared_error
class CheckpointError(RuntimeError):
    """A checkpoint cannot be used or written; the message names it and says why."""


@shared_error
class CheckpointMismatchError(CheckpointError):
    """A checkpoint that is intact but was written by another optimizer or model config: a config error (the message
    names the field), which no retry can mend."""


@shared_error
class StorageError(RuntimeError):
    """Storage the run needs beside its checkpoints (its lease, a resize request) could not be read or written, or the
    lease could not be renewed for half its TTL: the storage's trouble (exit 5), retried as such."""


@shared_error
class StoragePathError(CheckpointError):
    """A storage path no retry can write (a file where a directory must be, no permission, a read-only file system):
    a config error, where the same probe's other failures (a full disk, the storage service failing) are exit 5."""


@shared_error
class RunLeasedError(RuntimeError):
    """Another live launch holds the run (its lease), or took it over from this one: this one writes nothing."""


@shared_error
class LeaseRecordError(RuntimeError):
    """The run's lease file holds no record this program wrote (not JSON, a field missing): never taken, a person
    must look (a config error naming the file)."""


@shared_error
class EvalFailedError(RuntimeError):
    """An in-training evaluation failed and ``eval_harness_failure`` is ``stop``."""


@shared_error
class ResizeRequested(RuntimeError):
    """The launcher asked the run to stop at a checkpoint so that it can restart it on another slice count; the
    checkpoint is written."""


@shared_error
class Preempted(RuntimeError):
    """A preemption notice reached a host (SIGTERM): every host saved the same step, or, past the grace, left the
    previous checkpoint the resume point. ``saved_step`` is the step saved (None: none was)."""

    saved_step = None


#: ``eval_harness_failure``: what a failed in-training evaluation does (logged and counted either way).
EVAL_FAILURE_POLICIES = ("continue", "stop")


#: The error classes of this layer and their codes (the entry point adds its config and eval errors).
ERROR_EXIT_CODES: tuple[tuple[type[Exception], ExitCode], ...] = (
    (NonFiniteTrainingError, ExitCode.NONFINITE_STOP),
    (DataExhaustedError, ExitCode.DATA_EXHAUSTED),
    (StoragePathError, ExitCode.CONFIG_ERROR),
    (CheckpointMismatchError, ExitCode.CONFIG_ERROR),
    (LeaseRecordError, ExitCode.CONFIG_ERROR),
    (RunLeasedError, ExitCode.LIVE_ELSEWHERE),
    (CheckpointError, ExitCode.CHECKPOINT_STORAGE),
    (StorageError, ExitCode.CHECKPOINT_STORAGE),
    (EvalFailedError, ExitCode.EVAL_FAILED),
    (ResizeRequested, ExitCode.RESIZE),
    (Preempted, ExitCode.PREEMPTED),
)
