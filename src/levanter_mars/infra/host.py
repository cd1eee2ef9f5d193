"""One TPU host's share of a run: the training program as a child process. Runs inside a Ray worker, so it
imports nothing heavy (the training process imports JAX and Levanter itself)."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from levanter_mars.infra.local_node import without_node_environment
from levanter_mars.training.run.launch_id import ATTEMPT_STARTED_ENV, LAUNCH_ID_ENV, SLICE_CHANGE_ENV

TRAIN_MODULE = "levanter_mars.main.train_lm"
_PR_SET_PDEATHSIG = 1
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


@dataclass(frozen=True)
class LocalHost:
    """How a host of the local pod differs from a TPU host: its simulated devices, and (with more than one host)
    the ``jax.distributed`` flags a TPU pod would detect by itself."""

    num_hosts: int
    """Hosts per slice."""
    devices_per_host: int
    rendezvous: Optional[str] = None
    """Name of the job's :class:`~levanter_mars.infra.rendezvous.Rendezvous` actor (more than one host)."""
    num_slices: int = 1

    @property
    def num_processes(self) -> int:
        """Training processes of the whole pod, every slice's hosts, joined by one ``jax.distributed`` coordinator."""
        return self.num_hosts * self.num_slices


def process_id(slice_id: int, worker_id: int, hosts_per_slice: int) -> int:
    """A host's ``jax.distributed`` process id: slice-major, as the run counts slices (``compat/levanter_slices``:
    slice ``s`` holds processes ``s * H .. s * H + H - 1``)."""
    if not 0 <= worker_id < hosts_per_slice:
        raise ValueError(f"worker {worker_id} is not a host of a slice of {hosts_per_slice}")
    return slice_id * hosts_per_slice + worker_id


def slice_id_of_task(local: LocalHost, environ: Mapping[str, str]) -> int:
    """This host task's slice: with several, ``run_on_pod`` gives each slice's tasks ``MEGASCALE_SLICE_ID``."""
    if local.num_slices == 1:
        return 0
    if environ.get("MEGASCALE_NUM_SLICES") != str(local.num_slices) or "MEGASCALE_SLICE_ID" not in environ:
        raise RuntimeError(
            f"a host of a {local.num_slices}-slice local pod was started with MEGASCALE_NUM_SLICES="
            f"{environ.get('MEGASCALE_NUM_SLICES')!r}, MEGASCALE_SLICE_ID={environ.get('MEGASCALE_SLICE_ID')!r}: "
            "Levanter's run_on_pod sets both per slice"
        )
    return int(environ["MEGASCALE_SLICE_ID"])


def distributed_flags(num_processes: int, process_id: int | str, port: int | str) -> list[str]:
    """Levanter's own flags, as every host of the local pod gets them."""
    return [
        "--trainer.distributed.coordinator_address", f"127.0.0.1:{port}",
        "--trainer.distributed.num_processes", str(num_processes),
        "--trainer.distributed.process_id", str(process_id),
    ]  # fmt: skip


def with_device_count(xla_flags: str, devices: int) -> str:
    """``xla_flags`` with its simulated CPU device count set to ``devices`` (other flags kept)."""
    kept = re.sub(rf"\s*{_DEVICE_COUNT_FLAG}=\S*", "", xla_flags).strip()
    return f"{kept} {_DEVICE_COUNT_FLAG}={devices}".strip()


def _die_with_parent() -> None:
    # If Ray kills this host's worker (a cancelled or lost attempt), the training process must not live on
    # holding the accelerator and writing checkpoints next to the next attempt.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def training_environment(
    environ: Mapping[str, str], secrets: Mapping[str, str], local: bool, launch_id: Optional[str] = None
) -> dict[str, str]:
    env = without_node_environment(environ) if local else dict(environ)
    env.update(secrets)
    if launch_id:
        env[LAUNCH_ID_ENV] = launch_id  # one-shot actions (fresh=true) happen once per launch, not per attempt
    return env


def local_host_setup(local: LocalHost, environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The extra training flags and environment of this host of the local pod. With several hosts (in all slices),
    this blocks until every host of the attempt has asked (the rendezvous hands them all the same fresh coordinator
    port). The ``MEGASCALE_*`` variables stay in the environment the training process inherits."""
    env = {"XLA_FLAGS": with_device_count(environ.get("XLA_FLAGS", ""), local.devices_per_host)}
    if local.num_processes == 1:
        return [], env
    from levanter_mars.infra.rendezvous import coordinator_port

    worker_id = int(environ["TPU_WORKER_ID"])  # this node's place in the slice, as Levanter's scheduler reads it
    process = process_id(slice_id_of_task(local, environ), worker_id, local.num_hosts)
    port = coordinator_port(local.rendezvous, process)
    return distributed_flags(local.num_processes, process, port), env


def run_host(
    train_argv: Sequence[str], workdir: Optional[str], local: Optional[LocalHost], secrets: Mapping[str, str],
    launch_id: Optional[str] = None, slice_change: Optional[str] = None, exit_board: Optional[str] = None,
) -> dict:
    """Runs the training program to completion and returns how it ended, whatever that was: the driver judges every
    host's exit together (``training/outcome.py``), since a host's crash or signal may only follow another host's
    decision (process 0 decides a stop, then its peers are torn down). ``run_on_pod`` would retry a host that raised
    before the others had ended. ``process`` orders the hosts: slice, then worker. ``exit_board``: the attempt's
    (``exit_board.py``), where the result is also posted, for the driver to read if a slice is lost."""
    started = time.time()  # the goodput record's start of this attempt: the launcher's clock, before the interpreter
    host = socket.gethostname()
    env = training_environment(os.environ, secrets, local is not None, launch_id)
    env[ATTEMPT_STARTED_ENV] = repr(started)
    if slice_change:  # for the run's goodput record
        env[SLICE_CHANGE_ENV] = slice_change
    argv = list(train_argv)
    if local is not None:
        flags, extra_env = local_host_setup(local, os.environ)
        argv += flags
        env.update(extra_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", TRAIN_MODULE, *argv],
        cwd=workdir or os.getcwd(),
        env=env,
        preexec_fn=_die_with_parent,
    )
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:  # this task is being cancelled: take the training process down with it
            proc.kill()
            proc.wait()
    process = (int(os.environ.get("MEGASCALE_SLICE_ID", 0)), int(os.environ.get("TPU_WORKER_ID", 0)))
    result = {"host": host, "pid": proc.pid, "returncode": code, "process": process}
    if exit_board:
        _post(exit_board, result)
    return result


def _post(exit_board: str, result: dict) -> None:
    from levanter_mars.infra.exit_board import post_to

    try:
        post_to(exit_board, result)
    except Exception as e:  # noqa: BLE001 - the result still goes back the usual way; a lost slice needs the board
        print(f"could not post this host's result to the attempt's exit board: {type(e).__name__}: {e}",
              file=sys.stderr)  # fmt: skip


def host_task(
    train_argv: Sequence[str], workdir: Optional[str], local: Optional[LocalHost], secrets: Mapping[str, str],
    launch_id: Optional[str] = None, slice_change: Optional[str] = None, exit_board: Optional[str] = None,
) -> Callable[[], dict]:
    """The no-argument function ``run_on_pod`` runs on every host. The credentials ride in the closure (pickled
    into the Ray head's memory), not in a runtime environment, which Ray would write to its logs."""
    train_argv, secrets = list(train_argv), dict(secrets)

    def train_on_this_host() -> dict:
        return run_host(train_argv, workdir, local, secrets, launch_id, slice_change, exit_board)

    return train_on_this_host
