"""A local pod: N training processes on 127.0.0.1, each with its own simulated devices, joined by jax.distributed.

Every process gets Levanter's own flags (``--trainer.distributed.*``), as a TPU host would; they share the
checkpoint directory, as a pod's hosts share a bucket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.helpers import zygote
from tests.helpers.training import REPO, _env, cli_arguments


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_flags(num_processes: int, process_id: int, port: int) -> list[str]:
    return [
        "--trainer.distributed.coordinator_address", f"127.0.0.1:{port}",
        "--trainer.distributed.num_processes", str(num_processes),
        "--trainer.distributed.process_id", str(process_id),
    ]


@dataclass
class PodRun:
    procs: list  # subprocess.Popen or zygote.ForkedProcess
    logs: list[Path]

    def wait(self, timeout: float = 900) -> list[int]:
        deadline = time.time() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def describe(self) -> str:
        parts = []
        for i, proc in enumerate(self.procs):
            parts.append(f"--- process {i}: exit {proc.poll()} ---\n{self.output(i)[-5000:]}")
        return "\n".join(parts)


def start_pod(
    config_path: Path, *extra: str, num_processes: int = 2, devices: int = 2, log_dir: Path, prelude: str = "",
    name: Optional[str] = None, env: Optional[dict[str, str]] = None,
) -> PodRun:
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _env({**(env or {}), "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
    procs, logs = [], []
    for i in range(num_processes):
        log = log_dir / f"{name or config_path.stem}.process-{i}.{port}.log"
        with open(log, "w") as out:
            arguments = cli_arguments(config_path, *extra, *pod_flags(num_processes, i, port), prelude=prelude)
            procs.append(zygote.popen(arguments, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
        logs.append(log)
    return PodRun(procs, logs)


def run_pod(config_path: Path, *extra: str, timeout: float = 900, **kwargs) -> PodRun:
    pod = start_pod(config_path, *extra, **kwargs)
    pod.wait(timeout)
    return pod


def run_helper_processes(module: str, *, num_processes: int = 1, devices: int = 2, timeout: float = 300) -> list:
    """``python -m MODULE PORT PROCESS_ID`` in ``num_processes`` processes with ``devices`` simulated CPU devices each
    (a helper of several processes joins them with jax.distributed on PORT); each must exit 0 and end its stdout with
    one JSON line, returned in process order."""
    import json
    import tempfile

    env = _env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="levanter-mars-helpers-") as directory:
        logs = [(Path(directory, f"{i}.out"), Path(directory, f"{i}.err")) for i in range(num_processes)]
        procs = []
        for i, (out_path, err_path) in enumerate(logs):
            with open(out_path, "w") as out, open(err_path, "w") as err:
                procs.append(zygote.popen(["-m", module, str(port), str(i)], cwd=REPO, env=env, stdout=out, stderr=err))
        deadline = time.time() + timeout
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise
        outputs = [(o.read_text(), e.read_text(errors="replace")) for o, e in logs]
    for i, (proc, (_, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"{module}, process {i}: exit {proc.returncode}\n{err[-4000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
