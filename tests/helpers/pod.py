"""A local pod: N training processes on 127.0.0.1, each with its own simulated devices, joined by jax.distributed.

Every process gets Levanter's own flags (``--trainer.distributed.*``), as a TPU host would; they share the
checkpoint directory, as a pod's hosts share a bucket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from levanter_mars.infra.ports import PortLease, reserve_ports
from levanter_mars.training.pod_start import HEARTBEAT_TIMEOUT_S
from tests.helpers import zygote
from tests.helpers.training import REPO, _env, cli_arguments
from tests.helpers.xla_flags import device_flags

#: How long a test waits for a survivor to end itself after a peer's kill -9 before it calls the survivor hung: a hang
#: guard, not a measured promise (no test asserts a time). It ends by the heartbeat timeout, which jax.distributed is
#: given (tests/test_compat.py checks that); 10x that, so a loaded machine never fails the test.
SURVIVOR_DEADLINE_S = 10 * HEARTBEAT_TIMEOUT_S


def pod_flags(num_processes: int, process_id: int, port: int) -> list[str]:
    return [
        "--trainer.distributed.coordinator_address", f"127.0.0.1:{port}",
        "--trainer.distributed.num_processes", str(num_processes),
        "--trainer.distributed.process_id", str(process_id),
    ]


@dataclass
class FinishedProcess:
    """A process of a pod another test worker ran (tests/helpers/shared.py): ended with ``returncode``."""

    returncode: int

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.returncode

    def kill(self) -> None:
        pass


class PodHung(AssertionError):
    """A pod that did not end: its processes' stacks are in their logs, and the message shows every log's tail."""


@dataclass
class PodRun:
    procs: list  # subprocess.Popen or zygote.ForkedProcess
    logs: list[Path]
    #: The coordinator's port, reserved until the pod has ended (its wait returned, or it was killed).
    port: Optional[PortLease] = None

    def wait(self, timeout: float = 900, grace: float = 120, silent_s: Optional[float] = None) -> list[int]:
        """Waits for every process. A process that fails gives the others ``grace`` seconds to end too (a pod's hosts
        stop together); one still running then, or at ``timeout``, or every process running while none of the logs
        grew for ``silent_s`` seconds, is a hang: its Python stacks are dumped into its log (SIGABRT with faulthandler
        on, set by tests/conftest.py) and the error shows every log's tail."""
        deadline = time.time() + timeout
        sizes, grew_at = self.log_sizes(), time.time()
        while any(proc.poll() is None for proc in self.procs):
            failed = any(proc.poll() not in (None, 0) for proc in self.procs)
            if failed:
                deadline = min(deadline, time.time() + grace)
            now = self.log_sizes()
            if now != sizes:
                sizes, grew_at = now, time.time()
            silent = silent_s is not None and not failed and time.time() - grew_at > silent_s
            if time.time() > deadline or silent:
                self._dump_stacks()
                self.kill()
                why = "a process failed and another did not end" if failed else f"not done after {timeout:.0f} s"
                why = f"no log grew for {silent_s:.0f} s" if silent else why
                raise PodHung(f"pod of {len(self.procs)} processes: {why}\n{self.describe()}")
            time.sleep(0.5)
        self._release_port()
        return [proc.poll() for proc in self.procs]

    def log_sizes(self) -> list[int]:
        return [log.stat().st_size if log.exists() else 0 for log in self.logs]

    def _dump_stacks(self) -> None:
        running = [proc for proc in self.procs if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGABRT)
        end = time.time() + 10
        while time.time() < end and any(proc.poll() is None for proc in running):
            time.sleep(0.5)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._release_port()

    def _release_port(self) -> None:
        if self.port is not None:
            self.port.release()

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def record(self) -> dict:
        """A finished pod as JSON (tests/helpers/shared.py): its exit codes and logs."""
        return {"returncodes": [proc.poll() for proc in self.procs], "logs": [str(log) for log in self.logs]}

    @classmethod
    def restore(cls, record: dict) -> "PodRun":
        return cls([FinishedProcess(code) for code in record["returncodes"]], [Path(log) for log in record["logs"]])

    def describe(self) -> str:
        parts = []
        for i, proc in enumerate(self.procs):
            parts.append(f"--- process {i}: exit {proc.poll()} ---\n{self.output(i)[-5000:]}")
        return "\n".join(parts)


def start_pod(
    config_path: Path, *extra: str, num_processes: int = 2, devices: int = 2, log_dir: Path, prelude: str = "",
    name: Optional[str] = None, env: Optional[dict[str, str]] = None,
    process_env: Callable[[int], dict[str, str]] = lambda i: {},
) -> PodRun:
    """``process_env(i)``: what process ``i``'s environment adds (a multi-slice pod's ``MEGASCALE_SLICE_ID``)."""
    lease = reserve_ports(1)
    port = lease.port
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _env({**(env or {}), "XLA_FLAGS": device_flags(devices)})
    procs, logs = [], []
    for i in range(num_processes):
        log = log_dir / f"{name or config_path.stem}.process-{i}.{port}.log"
        with open(log, "w") as out:
            arguments = cli_arguments(config_path, *extra, *pod_flags(num_processes, i, port), prelude=prelude)
            procs.append(zygote.popen(arguments, cwd=REPO, env={**env, **process_env(i)}, stdout=out,
                                      stderr=subprocess.STDOUT))  # fmt: skip
        logs.append(log)
    return PodRun(procs, logs, lease)


#: A pod whose logs stay still this long while all its processes run is hung. Its longest healthy silence is one
#: program's compile: at most 30 s under the suite's load (the compile times in the session's cache).
HUNG_AFTER_SILENCE_S = 180


def run_pod(config_path: Path, *extra: str, timeout: float = 600, **kwargs) -> PodRun:
    """Starts a pod and waits for it. A pod whose processes all still run at ``timeout``, or whose logs all stay still
    for :data:`HUNG_AFTER_SILENCE_S`, is hung: :class:`PodHung`, with every process's stacks dumped into its log.

    A hang fails the test; it is never run again. A retry once stood here (issue 46): simulated XLA:CPU pods hung in
    their loss evaluation, which was found to be programs loaded from the persistent compilation cache (now off on
    such pods: ``training.compilation_cache.loads_can_deadlock``), and two pods could share a coordinator port (now
    reserved: ``levanter_mars.infra.ports``). A retry made a regression that hangs 30% of pods pass 91% of the time."""
    pod = start_pod(config_path, *extra, **kwargs)
    pod.wait(timeout, silent_s=HUNG_AFTER_SILENCE_S)
    return pod


def run_helper_processes(module: str, *args: str, num_processes: int = 1, devices: int = 2,
                         timeout: float = 300, check: bool = True) -> list:  # fmt: skip
    """``python -m MODULE PORT PROCESS_ID [ARGS]`` in ``num_processes`` processes with ``devices`` simulated CPU devices each
    (a helper of several processes joins them with jax.distributed on PORT); each must exit 0 and end its stdout with
    one JSON line, returned in process order. With ``check=False``: each process's exit code and stderr instead
    (where a helper shows how a process dies)."""
    import json

    env = _env({"XLA_FLAGS": device_flags(devices), "JAX_PLATFORMS": "cpu",
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    with reserve_ports(1) as lease, tempfile.TemporaryDirectory(prefix="levanter-mars-helpers-") as directory:
        port = lease.port
        logs = [(Path(directory, f"{i}.out"), Path(directory, f"{i}.err")) for i in range(num_processes)]
        procs = []
        for i, (out_path, err_path) in enumerate(logs):
            with open(out_path, "w") as out, open(err_path, "w") as err:
                procs.append(zygote.popen(["-m", module, str(port), str(i), *args], cwd=REPO, env=env, stdout=out,
                                          stderr=err))  # fmt: skip
        deadline = time.time() + timeout
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise
        outputs = [(o.read_text(), e.read_text(errors="replace")) for o, e in logs]
    if not check:
        return [(proc.returncode, err) for proc, (_, err) in zip(procs, outputs)]
    for i, (proc, (_, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"{module}, process {i}: exit {proc.returncode}\n{err[-4000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
