"""Running pre-flight as a user does (a child process), for the pre-flight tests; and the TPU compiler they need."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: ``=1``: the tests that need the TPU compiler (libtpu) skip without it, saying so. Unset, they fail without it:
#: ``make setup`` installs it (the ``tpu`` extra), so its absence is a broken setup, which a skip would hide.
NO_TPU_COMPILER_ENV = "LEVANTER_MARS_TEST_NO_TPU_COMPILER"


def require_tpu_compiler() -> None:
    """Returns where libtpu is installed; else fails the calling test, or skips it where :data:`NO_TPU_COMPILER_ENV`
    asks."""
    if importlib.util.find_spec("libtpu") is not None:
        return
    if os.environ.get(NO_TPU_COMPILER_ENV) == "1":
        pytest.skip(f"the TPU compiler (libtpu) is not installed, and {NO_TPU_COMPILER_ENV}=1 allows that")
    pytest.fail(f"the TPU compiler is not installed: pip install -c constraints.txt '.[tpu]' (make setup does), or "
                f"set {NO_TPU_COMPILER_ENV}=1 to skip the tests that need it")


def run_preflight(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # TPU executables are not for this machine's cache
    return subprocess.run(
        [sys.executable, "-m", "levanter_mars.main.preflight", *args],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout,
    )


def last_json(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def refusal_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``does not fit:`` line of a pre-flight that refused a config (exit 2)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("does not fit:")]
    assert len(said) == 1, proc.stderr[-3000:]
    return said[0]
