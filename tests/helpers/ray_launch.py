"""Running the launcher: dry runs that must contact nothing, and runs against a local Ray cluster with the processes
they start, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional

import psutil
import pytest
import yaml

from tests.helpers.training import POLL_S, REPO

TRAIN_MODULE = "levanter_mars.main.train_lm"


class ContactError(AssertionError):
    pass


@pytest.fixture(autouse=True)
def contact_nothing(monkeypatch):
    """A dry run must not open a socket (not even to 127.0.0.1), start a process, or touch Ray. Autouse in every
    test module that imports it."""
    import ray
    import ray.job_submission

    def refuse(*args, **kwargs):
        raise ContactError(f"contacted something: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", refuse)
    monkeypatch.chdir(REPO)


def dry_run(capsys, *argv):
    """``launch --dry_run argv``: returns the plan, the resolved training config and the whole output."""
    from levanter_mars.infra import launch

    code = launch.cli(["--dry_run", "--skip_preflight", *argv])  # pre-flight has its own tests (test_preflight.py)
    out, err = capsys.readouterr()
    assert code == 0, err
    plan, config = yaml.safe_load_all(out)
    return plan, config, out


def launcher_command(config_path: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "levanter_mars.infra.launch",
        "--config_path",
        str(config_path),
        "--tpu_type",
        "cpu",
        *flags,
    ]


def launcher_env(cluster_env: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    env = {**os.environ, **cluster_env, **secrets}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    return env


@contextlib.contextmanager
def launched(config_path: Path, env: Mapping[str, str], log_path: Path, *flags: str) -> Iterator[subprocess.Popen]:
    """The launcher running in the background (its output in ``log_path``); killed on exit if still running."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            launcher_command(config_path, *flags), cwd=REPO, env=dict(env), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                # SIGTERM first: the launcher then stops the private Ray cluster it started (a SIGKILL leaves it
                # running, with its processes, after a failed test).
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def training_process(config_path: Path) -> Optional[psutil.Process]:
    """The training process of the run of ``config_path`` (unique per test), if one is running."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if TRAIN_MODULE in cmdline and str(config_path) in cmdline:
            return proc
    return None


def training_processes(config_path: Path) -> list[psutil.Process]:
    """The training processes of the run of ``config_path`` on every host of a local pod, by process id."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if TRAIN_MODULE in cmdline and str(config_path) in cmdline:
            found.append((process_id(cmdline), proc))
    return [proc for _, proc in sorted(found, key=lambda pair: pair[0])]


def process_id(cmdline: list[str]) -> int:
    flag = "--trainer.distributed.process_id"
    return int(cmdline[cmdline.index(flag) + 1]) if flag in cmdline else 0


def wait_for(condition: Callable[[], object], timeout: float = 300, poll: float = POLL_S, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")


def files_containing(roots: Iterable[Path], needles: Iterable[str]) -> list[str]:
    """Every file under ``roots`` whose bytes contain one of ``needles``."""
    encoded = [n.encode() for n in needles]
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            try:
                if path.is_file() and not path.is_symlink():
                    data = path.read_bytes()
                    if any(n in data for n in encoded):
                        found.append(str(path))
            except OSError:
                continue
    return found
