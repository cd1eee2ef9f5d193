"""Programs run as a user runs them, in processes of their own, with nothing imported beyond the standard library and
the zygote's client (.ci/newest runs tests that use this in a venv without Levanter, with LEVANTER_MARS_TEST_FORK=0)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

from tests.helpers import zygote
from tests.helpers.xla_flags import device_flags

REPO = Path(__file__).resolve().parents[2]
#: Set in the child process before jax is imported.
EIGHT_DEVICES = {"XLA_FLAGS": device_flags(8), "JAX_PLATFORMS": "cpu"}


def _env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def run_python(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` (a script, ``-m module`` or ``-c code``) from the repository root, to completion, in a process of
    its own (forked from the test zygote); ``env`` adds environment variables."""
    return zygote.run(list(args), cwd=REPO, env=_env(env), timeout=timeout)
