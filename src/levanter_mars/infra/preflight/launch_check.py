"""The launcher's pre-flight: before anything is submitted, the run's train step is compiled for its slice.

It runs ``python -m levanter_mars.main.preflight`` as a child process (the TPU compiler and the model stay out of the
launcher's process), in the working directory the hosts would get, with the same config and overrides.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

SKIP_FLAG = "--skip_preflight"


def take_skip_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """``--skip_preflight`` among the launcher's own flags (before ``--``): whether it was given, and argv without
    it."""
    argv = list(argv)
    own = argv[: argv.index("--")] if "--" in argv else argv
    if SKIP_FLAG not in own:
        return False, argv
    argv.remove(SKIP_FLAG)
    return True, argv


def preflight_run(run, working_dir: str, skip: bool) -> tuple[int, str]:
    """Returns (exit code, the text the dry run shows). Exit 2: the step does not fit or the config is bad."""
    if skip:
        return 0, f"skipped ({SKIP_FLAG}): nothing checked that the step fits the slice"
    if run.slice.is_local:
        return 0, "not run: the local engine is not a TPU slice"
    config_path, overrides = run.train_argv[1], run.train_argv[2:]
    command = [
        sys.executable, "-m", "levanter_mars.main.preflight", "--config_path", config_path,
        "--tpu_type", run.slice.name, "--num_slices", str(run.job.num_slices), "--", *overrides,
    ]
    print(f"pre-flight: compiling the train step for {run.job.num_slices} x {run.slice.name} "
          f"(TPU compiler, on this machine; {SKIP_FLAG} skips it)", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=working_dir, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    said = [line for line in done.stderr.splitlines() if line.startswith(("does not fit:", "config error:", "error:"))]
    if done.returncode != 0:
        reason = said[-1] if said else (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return 2, f"refused, nothing was submitted: {reason}"
    return 0, done.stdout.strip()
