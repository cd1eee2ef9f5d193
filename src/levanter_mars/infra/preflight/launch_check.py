"""The launcher's pre-flight: before anything is submitted, the run's train step is compiled for its slice.

It runs ``python -m levanter_mars.main.preflight`` as a child process (the TPU compiler and the model stay out of the
launcher's process), in the working directory the hosts would get, with the same config and overrides, its output in a
log file. Its exit 2 is a refusal (the step does not fit, or the config is bad): the launcher exits 2. Anything else
that is not 0 (a traceback, a compiler crash, a compile killed for memory) is pre-flight crashing, not a verdict on
the config: the launcher says so, names the log, and exits 1 (``--skip_preflight`` submits without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Sequence

SKIP_FLAG = "--skip_preflight"
PREFLIGHT_MODULE = "levanter_mars.main.preflight"
#: Pre-flight's refusal: the step does not fit, or the config is bad (main/preflight.py).
REFUSED = 2
#: A write probe of pre-flight's failed: the storage, not the config (exit 5, as the training program's).
STORAGE = 5


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
    """Returns (the launcher's exit code, the text the dry run shows): 0 and pre-flight's table; 2 and its refusal;
    1 and where its log is, when it crashed. A run that may limp (``--num_slices 2,1``) is checked on every count, the
    largest first: one count that does not fit refuses the launch."""
    if skip:
        return 0, f"skipped ({SKIP_FLAG}): nothing checked that the step fits the slice"
    if run.slice.is_local:
        return 0, "not run: the local engine is not a TPU slice"
    tables = []
    for count in run.job.slice_counts:
        code, text = _preflight_count(run, working_dir, count)
        if code != 0:
            return code, text if len(run.job.slice_counts) == 1 else f"on {count} slice(s): {text}"
        tables.append(text if len(run.job.slice_counts) == 1 else f"# {count} slice(s)\n{text}")
    return 0, "\n".join(tables)


def _preflight_count(run, working_dir: str, count: int) -> tuple[int, str]:
    config_path, overrides = run.train_argv[1], run.train_argv[2:]
    command = [
        sys.executable, "-m", PREFLIGHT_MODULE, "--config_path", config_path,
        "--tpu_type", run.slice.name, "--num_slices", str(count), "--", *overrides,
    ]  # fmt: skip
    print(f"pre-flight: compiling the train step for {count} x {run.slice.name} "
          f"(TPU compiler, on this machine; {SKIP_FLAG} skips it)", file=sys.stderr, flush=True)
    log_fd, log_path = tempfile.mkstemp(prefix=f"levanter-mars-preflight-{run.run_id}-", suffix=".log")
    with os.fdopen(log_fd, "w") as log:
        done = subprocess.run(command, cwd=working_dir, stdout=subprocess.PIPE, stderr=log, text=True,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})  # fmt: skip
        log.write(f"\n--- stdout ---\n{done.stdout}")
    with open(log_path) as log:
        stderr = log.read()
    if done.returncode == 0:
        os.unlink(log_path)
        return 0, done.stdout.strip()
    if done.returncode == STORAGE:
        said = [line for line in stderr.splitlines() if line.startswith("error:")]
        return STORAGE, f"could not write where the run writes, nothing was submitted: {(said or ['(no output)'])[-1]}"
    if done.returncode == REFUSED:
        said = [line for line in stderr.splitlines() if line.startswith(("does not fit:", "config error:", "error:"))]
        reason = said[-1] if said else (stderr.strip().splitlines() or ["(no output)"])[-1]
        return REFUSED, f"refused, nothing was submitted: {reason}"
    from levanter_mars.training.errors import describe_exit

    last = (stderr.split("\n--- stdout ---")[0].strip().splitlines() or ["(no output)"])[-1]
    return 1, (f"crashed ({describe_exit(done.returncode)}; its last line: {last}). That is no verdict on the config; "
               f"nothing was submitted. Its log: {log_path}. {SKIP_FLAG} submits without pre-flight.")  # fmt: skip
