"""Running a comparison's runs: N training processes at a time on this machine, or each through the launcher (a local
pod or a TPU slice), with one progress line on the terminal.

Each run is its own process, started with the run's config path and the comparison's overrides; a run stopped
anywhere (Ctrl-C, a crash, a lost machine) resumes from its checkpoints the next time the comparison runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TextIO

from levanter_mars.compare.tuning import RunKey
from levanter_mars.compare.spec import CompareConfig, SpecError

#: Seconds between looks at the running processes (and between progress lines when nothing changes: 30).
POLL_S = 1.0
PROGRESS_EVERY_S = 30.0


def shipped_path(path: str) -> str:
    """``path`` relative to the working directory, which the launcher ships to a pod's hosts (and runs in)."""
    relative = os.path.relpath(path)
    if relative.startswith(".."):
        raise SpecError(
            f"output_dir: runs on a slice read their configs from the working directory the launcher ships, and "
            f"{path} is outside it ({os.getcwd()}): use an output_dir under it"
        )
    return relative


def training_command(spec: CompareConfig, config_path: str, overrides: Sequence[str]) -> list[str]:
    """The command of one run: the training program itself, or the launcher with the spec's slice."""
    if spec.tpu_type is None:
        return [sys.executable, "-m", "levanter_mars.main.train_lm", "--config_path", config_path, *overrides]
    # The local engine runs in this directory; a TPU slice's hosts in the working directory the launcher ships.
    path = config_path if spec.tpu_type == "cpu" else shipped_path(config_path)
    # A stopped comparison (a signal, run_timeout) stops its runs: on a pod, the launcher stops its Ray job too.
    command = [sys.executable, "-m", "levanter_mars.infra.launch", "--config_path", path,
               "--tpu_type", spec.tpu_type, "--num_slices", str(spec.num_slices), "--stop_job_on_interrupt", "true"]  # fmt: skip
    if spec.tpu_type == "cpu":
        command += ["--num_hosts", str(spec.num_hosts)]
        if spec.devices_per_host is not None:
            command += ["--devices_per_host", str(spec.devices_per_host)]
    if spec.address:
        command += ["--address", spec.address]
    return command + (["--", *overrides] if overrides else [])


def where(spec: CompareConfig) -> str:
    if spec.tpu_type is None:
        return "local"
    if spec.tpu_type == "cpu":
        return f"local pod, {spec.num_hosts} host(s)"
    return f"{spec.tpu_type} x {spec.num_slices}"


@dataclass
class Running:
    key: RunKey
    run_id: str
    process: subprocess.Popen
    log: TextIO
    started: float
    metrics_path: Optional[str]
    num_steps: int
    _read: int = 0
    """Bytes of the metrics file read so far: each look parses only the records appended since (the file grows to
    a record per step, and the pool looks every second)."""
    _step: int = 0

    def step(self) -> Optional[int]:
        if self.metrics_path is None:
            return None
        try:
            with open(self.metrics_path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._read:  # set aside and started again
                    self._read, self._step = 0, 0
                f.seek(self._read)
                appended = f.read()
        except FileNotFoundError:
            return self._step
        complete = appended[: appended.rfind(b"\n") + 1]  # a torn last record is read whole next time
        self._read += len(complete)
        for line in complete.splitlines():
            try:
                self._step = max(self._step, int(json.loads(line)["step"]) + 1)
            except (ValueError, KeyError, TypeError):
                continue
        return self._step


@dataclass(frozen=True)
class Ended:
    key: RunKey
    run_id: str
    exit_code: int
    seconds: float


class Pool:
    """At most ``parallel`` runs at once; ``wait`` returns the runs that ended."""

    def __init__(self, parallel: int, timeout: Optional[float], report: Callable[[str], None]):
        self.parallel = parallel
        self.timeout = timeout
        self.report = report
        self.running: dict[RunKey, Running] = {}
        self._last_line = ("", 0.0)

    @property
    def full(self) -> bool:
        return len(self.running) >= self.parallel

    def start(self, key: RunKey, run_id: str, command: list[str], log_path: str, metrics_path: Optional[str],
              num_steps: int) -> None:  # fmt: skip
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        log = open(log_path, "a")
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        log.flush()
        # Its own process group: Ctrl-C here stops the comparison, which then stops its runs (and their children).
        # A stop between starting it and knowing it would leave it training: the stops wait until it is known.
        stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.running[key] = Running(key, run_id, process, log, time.monotonic(), metrics_path, num_steps)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def wait(self, done: int, total: int) -> list[Ended]:
        """Blocks until a run ends; prints progress meanwhile."""
        while True:
            ended = []
            for key, run in list(self.running.items()):
                code = run.process.poll()
                elapsed = time.monotonic() - run.started
                if code is None and self.timeout is not None and elapsed > self.timeout:
                    _stop(run.process)
                    code = run.process.wait()
                    run.log.write(f"\n# stopped by the comparison after {elapsed:.0f} s (run_timeout)\n")
                if code is not None:
                    run.log.close()
                    del self.running[key]
                    ended.append(Ended(key, run.run_id, code, elapsed))
            if ended:
                return ended
            self._progress(done, total)
            time.sleep(POLL_S)

    def _progress(self, done: int, total: int) -> None:
        parts = []
        for run in self.running.values():
            step = run.step()
            parts.append(f"{run.run_id} step {step}/{run.num_steps}" if step is not None else f"{run.run_id} running")
        line = f"[{done}/{total} runs done] " + "; ".join(parts)
        last, at = self._last_line
        if line != last or time.monotonic() - at > PROGRESS_EVERY_S:
            self.report(line)
            self._last_line = (line, time.monotonic())

    def stop_all(self, grace_s: float = 30.0) -> None:
        """SIGTERM to every run's process group, then SIGKILL to those still there ``grace_s`` later (one grace for
        all of them)."""
        for run in self.running.values():
            _stop(run.process)
        deadline = time.monotonic() + grace_s
        for run in self.running.values():
            try:
                run.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(run.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                run.process.wait()
            run.log.close()
        self.running.clear()


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
