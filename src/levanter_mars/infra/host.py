"""One TPU host's share of a run: the training program as a child process. Runs inside a Ray worker, so it
imports nothing heavy (the training process imports JAX and Levanter itself)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

from levanter_mars.infra.local_node import without_node_environment

TRAIN_MODULE = "levanter_mars.main.train_lm"
_PR_SET_PDEATHSIG = 1


class TrainingProcessError(RuntimeError):
    """The training program ended non-zero on a host: a failure (not a preemption) for ``run_on_pod``."""


def _die_with_parent() -> None:
    # If Ray kills this host's worker (a cancelled or lost attempt), the training process must not live on
    # holding the accelerator and writing checkpoints next to the next attempt.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def training_environment(environ: Mapping[str, str], secrets: Mapping[str, str], local: bool) -> dict[str, str]:
    env = without_node_environment(environ) if local else dict(environ)
    env.update(secrets)
    return env


def run_host(train_argv: Sequence[str], workdir: Optional[str], local: bool, secrets: Mapping[str, str]) -> dict:
    """Runs the training program to completion. Raises TrainingProcessError if it fails or is killed."""
    host = socket.gethostname()
    proc = subprocess.Popen(
        [sys.executable, "-m", TRAIN_MODULE, *train_argv],
        cwd=workdir or os.getcwd(),
        env=training_environment(os.environ, secrets, local),
        preexec_fn=_die_with_parent,
    )
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:  # this task is being cancelled: take the training process down with it
            proc.kill()
            proc.wait()
    if code != 0:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise TrainingProcessError(f"training process {proc.pid} on {host} ended with {how}")
    return {"host": host, "pid": proc.pid, "returncode": code}


def host_task(
    train_argv: Sequence[str], workdir: Optional[str], local: bool, secrets: Mapping[str, str]
) -> Callable[[], dict]:
    """The no-argument function ``run_on_pod`` runs on every host. The credentials ride in the closure (pickled
    into the Ray head's memory), not in a runtime environment, which Ray would write to its logs."""
    train_argv, secrets = list(train_argv), dict(secrets)

    def train_on_this_host() -> dict:
        return run_host(train_argv, workdir, local, secrets)

    return train_on_this_host
