"""Python processes forked from one that has already imported the training stack, instead of started from scratch.

Every end-to-end test runs programs as a user would (``python -c ...``, ``python -m ...``, ``python script.py``), each
in a process of its own that can be killed, and most of the suite's time went into starting them: an interpreter that
imports jax, Levanter, transformers, lm-eval, Ray and tensorstore again (6-20 s each, about 100 times a session).
Here one *zygote* process imports all that once, before any JAX backend, thread or network client exists, and forks a
child per program. The child sets its environment, working directory and output files, then runs the program as the
interpreter would (``__main__``, ``sys.argv``, exit code, atexit handlers, a traceback on an uncaught exception) and
exits. It is a real process: kill -9 kills it, a pod's processes join through ``jax.distributed`` as before.

What a fork cannot give is a variable read while the zygote imported (``JAX_*`` flags become jax config defaults at
import), or a module other than the one the zygote imported: a program whose environment differs from the zygote's
in any variable outside :data:`READ_AFTER_IMPORT`, or whose ``PYTHONPATH`` would find a preloaded module elsewhere
(tests/helpers/zygote_server.py: ``shadowed``), runs as a plain subprocess instead, as does every program when
``LEVANTER_MARS_TEST_FORK=0``. The server's side is tests/helpers/zygote_server.py.
"""

from __future__ import annotations

import atexit
import io
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Client
from pathlib import Path
from typing import Mapping, Optional, Sequence

#: Environment variables that are read when used, not when the zygote's modules were imported: a child may differ.
#: XLA_FLAGS is parsed when the first backend starts (the zygote starts none); the storage emulator's variables when
#: gcsfs/tensorstore first open a bucket (neither is imported or opened in the zygote: checked at its start).
READ_AFTER_IMPORT = frozenset({
    "XLA_FLAGS", "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "PYTHONPATH", "LEVANTER_MARS_LAUNCH_ID",
    "RUN_ID", "HF_TOKEN", "WANDB_API_KEY",
    "PYTEST_CURRENT_TEST",  # pytest sets it for every test: were it compared, no test but the first would fork
    "KMP_DUPLICATE_LIB_OK",  # scikit-learn sets it when a test imports it; read when a second OpenMP runtime loads
    "TOKENIZERS_PARALLELISM",  # datasets sets it around a multi-process map; tokenizers reads it when it encodes
})
#: The test session's environment once its tests are collected, before any ran (conftest.py sets it): the zygote's.
#: A library that changes ``os.environ`` during the test that happens to start the zygote (conftest.py restores it
#: after each test) must not become every later program's reference. None outside a test session (scripts that use
#: the helpers): the first program's environment.
SESSION_ENVIRONMENT: Optional[dict[str, str]] = None
#: What the zygote imports before it forks: the training and eval entry points and what they import lazily.
PRELOAD = ("levanter_mars.main.train_lm", "levanter_mars.main.eval_harness", "matplotlib.pyplot")
#: The entry points' config classes (module, class): draccus reads the help text of every field from its class's
#: source when it builds a parser, about 1 CPU-second a program; read once in the zygote, every fork has it.
CONFIG_CLASSES = (("levanter_mars.program_config", "TrainAndEvalConfig"),
                  ("levanter_mars.main.eval_harness", "EvalHarnessMainConfig"))
#: Modules that must not be imported in the zygote, since they read the emulator's address at import.
NOT_PRELOADED = ("gcsfs",)
ENABLED = os.environ.get("LEVANTER_MARS_TEST_FORK", "1") != "0"
POLL_S = 0.5


# --------------------------------------------------------------------------------------------------- the client


class ForkedProcess:
    """The part of ``subprocess.Popen``'s interface the tests use, for a child of the zygote. Waiting needs no
    polling: a pidfd (Linux) becomes readable when the child exits, then the zygote reaps it."""

    def __init__(self, zygote: "Zygote", pid: int, args: Sequence[str]):
        self._zygote, self.pid, self.args, self.returncode = zygote, pid, list(args), None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> Optional[int]:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if self.returncode is None:
            readable, _, _ = select.select([self._pidfd], [], [], timeout)
            if not readable:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = self._zygote.reap(self.pid)
            os.close(self._pidfd)
        return self.returncode

    def send_signal(self, signal_number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal_number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The pytest process's connection to its zygote, started on first use and stopped at exit."""

    def __init__(self, env: Mapping[str, str], cwd: str):
        self.env = dict(env)
        self._shadowed: dict[tuple[str, str], frozenset[str]] = {}
        self._dir = tempfile.mkdtemp(prefix="levanter-mars-zygote-")
        address, authkey = os.path.join(self._dir, "socket"), os.urandom(16)
        self.log = Path(self._dir, "zygote.log")
        with open(self.log, "w") as log:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.zygote_server", address], cwd=cwd, env=self.env,
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            )
        self._server.stdin.write(authkey.hex().encode() + b"\n")
        self._server.stdin.close()
        self._conn = self._connect(address, authkey)
        atexit.register(self.close)

    def _connect(self, address: str, authkey: bytes, timeout: float = 600):
        """Waits for the zygote's socket, then for its imports ("ready"); fails with its log if it dies first."""
        deadline = time.monotonic() + timeout
        conn = None
        while time.monotonic() < deadline and self._server.poll() is None:
            if conn is None and os.path.exists(address):
                conn = Client(address, family="AF_UNIX", authkey=authkey)
            if conn is not None and conn.poll(0.2):
                ready = conn.recv()
                if ready == "ready":
                    return conn
                break
            elif conn is None:
                time.sleep(POLL_S)
        self._server.kill()
        raise RuntimeError(f"the test zygote did not start:\n{self.log.read_text(errors='replace')[-4000:]}")

    def _call(self, *message):
        self._conn.send(message)
        reply = self._conn.recv()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def spawn(self, args: Sequence[str], *, cwd: str, env: Mapping[str, str], stdout: str, stderr: str) -> ForkedProcess:
        pid = self._call("spawn", list(args), str(cwd), dict(env), str(stdout), str(stderr))
        return ForkedProcess(self, pid, [sys.executable, *args])

    def reap(self, pid: int) -> int:
        """The exit code of a child that has exited."""
        return self._call("reap", pid)

    def differences(self, env: Mapping[str, str]) -> frozenset[str]:
        """The variables, outside :data:`READ_AFTER_IMPORT`, in which ``env`` differs from the zygote's."""
        keys = (set(env) | set(self.env)) - READ_AFTER_IMPORT
        return frozenset(k for k in keys if env.get(k) != self.env.get(k))

    def shadowed(self, pythonpath: str, cwd: str) -> frozenset[str]:
        """``PYTHONPATH (shadows NAME)`` for each module the zygote imported that a child with this ``PYTHONPATH``
        (and working directory) would import from elsewhere: such a child cannot be forked."""
        key = (pythonpath, cwd)
        if key not in self._shadowed:
            self._shadowed[key] = frozenset(f"PYTHONPATH (shadows {name})" for name in
                                            self._call("shadowed", pythonpath, cwd))
        return self._shadowed[key]

    def close(self) -> None:
        if self._server.poll() is None:
            try:
                self._call("exit")
            except (EOFError, OSError):
                pass
            try:
                self._server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._server.kill()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)


_ZYGOTE: Optional[Zygote] = None
#: How the session's programs started: forks, and fresh interpreters by the variables (or shadowed modules) that sent
#: them there (the session's summary prints it, so a variable that starts to differ is seen the day it costs the suite
#: its forks).
FORKS = 0
FRESH: Counter[frozenset[str]] = Counter()


def _zygote(env: Mapping[str, str], cwd: str) -> Optional[Zygote]:
    global _ZYGOTE, FORKS
    if not ENABLED:
        return None
    if _ZYGOTE is None:
        reference = env if SESSION_ENVIRONMENT is None else SESSION_ENVIRONMENT
        _ZYGOTE = Zygote({**reference, **{k: env[k] for k in READ_AFTER_IMPORT if k in env}}, cwd)
    differences = _ZYGOTE.differences(env) | _ZYGOTE.shadowed(env.get("PYTHONPATH", ""), cwd)
    if differences:
        FRESH[differences] += 1
        return None
    FORKS += 1
    return _ZYGOTE


def counts() -> dict:
    """This process's tallies as JSON-able data: a pytest-xdist worker sends them to the controller."""
    return {"forks": FORKS, "fresh": [[sorted(keys), n] for keys, n in FRESH.items()]}


def add_counts(tallies: dict) -> None:
    """Adds a worker's :func:`counts` to this process's, for :func:`summary`."""
    global FORKS
    FORKS += tallies["forks"]
    for keys, n in tallies["fresh"]:
        FRESH[frozenset(keys)] += n


def summary() -> list[str]:
    """Lines for the session's summary: how many programs were forked and why the others were not."""
    if not ENABLED:
        return ["test zygote off (LEVANTER_MARS_TEST_FORK=0): every program started a fresh interpreter"]
    lines = [f"test zygote: {FORKS} programs forked, {sum(FRESH.values())} in fresh interpreters"]
    lines += [f"  {n} because of {', '.join(sorted(keys))}" for keys, n in FRESH.most_common()]
    return lines


def popen(args: Sequence[str], *, cwd, env: Mapping[str, str], stdout=None, stderr=None, fork: bool = True):
    """``subprocess.Popen([sys.executable, *args], ...)``, forked from the zygote where it can be (``fork=False``: a
    fresh interpreter). ``stdout`` and ``stderr`` are open files, ``subprocess.DEVNULL``/``STDOUT`` or None."""
    zygote = _zygote(env, str(cwd)) if fork else None
    if zygote is None:
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr)
    out = _path_of(stdout)
    err = out if stderr is subprocess.STDOUT else _path_of(stderr)
    return zygote.spawn(args, cwd=cwd, env=env, stdout=out, stderr=err)


def _path_of(stream) -> str:
    if stream is None:
        return ""  # inherit the zygote's (the test session's) stream
    if stream is subprocess.DEVNULL:
        return os.devnull
    if isinstance(stream, io.IOBase) and hasattr(stream, "name"):
        stream.flush()
        return stream.name
    raise ValueError(f"a forked process writes to a file, not to {stream!r}")


def run(args: Sequence[str], *, cwd, env: Mapping[str, str], timeout: float, fork: bool = True
        ) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)``, forked where it can be."""
    with tempfile.TemporaryDirectory(prefix="levanter-mars-run-") as directory:
        out_path, err_path = Path(directory, "stdout"), Path(directory, "stderr")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = popen(args, cwd=cwd, env=env, stdout=out, stderr=err, fork=fork)
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        read = lambda p: p.read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess([sys.executable, *args], returncode, read(out_path), read(err_path))
