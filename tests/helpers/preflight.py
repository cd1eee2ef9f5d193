"""Running pre-flight as a user does (a child process), for the pre-flight tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
