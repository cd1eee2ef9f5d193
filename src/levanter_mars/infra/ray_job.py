"""The Ray job that runs a prepared training run, and submitting/following it through Ray's job API.

The job's entrypoint (``python -m levanter_mars.infra.pod``) runs on the cluster head and hands one training
process per TPU host to Levanter's ``run_on_pod``, which also does the retrying.

Credentials travel in the job's *metadata*, not its runtime environment: Ray's runtime-env agent writes every
runtime environment, ``env_vars`` included, to ``runtime_env_agent.log`` on each node. The metadata lives in the Ray
head's memory (the job API shows it to holders of the dashboard token); the entrypoint takes the values out before
it connects to Ray and hands them to the training processes' environment only (``pod.py``).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import levanter_mars
from levanter_mars.infra.config import SECRET_METADATA_PREFIX, LaunchError, RayLaunchConfig
from levanter_mars.infra.plan import REDACTED, PreparedRun

POD_MODULE = "levanter_mars.infra.pod"
LOCAL_WORKER_HOOK = "levanter_mars.infra.local_worker.prepare_worker"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Not shipped to a pod: outputs, caches and environments (Ray also honours .gitignore).
WORKING_DIR_EXCLUDES = [".git", ".venv", "runs", "checkpoints", ".cache", "wandb", "logs", "**/__pycache__"]
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(frozen=True)
class RayJob:
    submission_id: str
    entrypoint: tuple[str, ...]
    runtime_env: Mapping[str, Any]
    metadata: Mapping[str, str]
    """Holds the credentials (under SECRET_METADATA_PREFIX): never print it, print :meth:`printable`."""

    @property
    def entrypoint_command(self) -> str:
        return shlex.join(self.entrypoint)

    def printable(self) -> dict[str, Any]:
        metadata = {k: (REDACTED if k.startswith(SECRET_METADATA_PREFIX) else v) for k, v in self.metadata.items()}
        return {
            "submission_id": self.submission_id,
            "entrypoint": self.entrypoint_command,
            "runtime_env": dict(self.runtime_env),
            "metadata": metadata,
        }


def resolve_address(address: Optional[str], environ: Mapping[str, str] = os.environ) -> str:
    return address or environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


def submission_id(run_id: str, now: Optional[datetime.datetime] = None) -> str:
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"levanter-mars-{re.sub(r'[^A-Za-z0-9_.-]', '-', run_id)}-{stamp}"


def _package_source_dir() -> str:
    return str(Path(levanter_mars.__file__).resolve().parents[1])


def build_job(run: PreparedRun, launch: RayLaunchConfig, environ: Mapping[str, str] = os.environ) -> RayJob:
    job = run.job
    pod_args = [
        "--tpu_type", job.tpu_type,
        "--num_slices", str(job.num_slices),
        "--retries", str(job.retries),
        "--preemption_retries", str(job.preemption_retries),
        "--storage_retries", str(job.storage_retries),
    ]  # fmt: skip
    if len(job.slice_counts) > 1:  # a run that may limp grows back at a checkpoint, asked beside its checkpoints
        pod_args += ["--scale_up_wait_s", str(job.scale_up_wait_s), "--resize_request", _resize_request(run, launch)]
    if run.secrets:
        pod_args += ["--secrets", ",".join(sorted(run.secrets))]
    if run.config.fresh:  # the driver says once that it applies to the first attempt only
        pod_args += ["--fresh", "true"]
    env_vars = {"RUN_ID": run.run_id}
    if run.slice.is_local:
        # Same machine: run this interpreter on this checkout, in this directory.
        workdir = os.path.realpath(launch.working_dir)
        pod_args += ["--workdir", workdir]
        pod_args += ["--num_hosts", str(run.slice.hosts), "--devices_per_host", str(run.slice.devices_per_host)]
        python = sys.executable
        paths = [_package_source_dir(), *environ.get("PYTHONPATH", "").split(os.pathsep)]
        env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        runtime_env: dict[str, Any] = {"env_vars": env_vars, "worker_process_setup_hook": LOCAL_WORKER_HOOK}
    else:
        python = "python"  # the cluster image's
        env_vars["PYTHONPATH"] = "src"  # the shipped checkout first, then the copy installed in the image
        runtime_env = {"working_dir": launch.working_dir, "excludes": WORKING_DIR_EXCLUDES, "env_vars": env_vars}
    entrypoint = (python, "-m", POD_MODULE, *pod_args, "--", *run.train_argv)
    metadata = {"launcher": "levanter-mars", "run_id": run.run_id}
    metadata.update({SECRET_METADATA_PREFIX + name: value for name, value in run.secrets.items()})
    return RayJob(submission_id(run.run_id), entrypoint, runtime_env, metadata)


def _resize_request(run: PreparedRun, launch: RayLaunchConfig) -> str:
    """Where the driver asks the run to stop at a checkpoint, as the hosts name it: relative to the local engine's
    working directory, where they run."""
    from levanter_mars.training.run.resize import resize_request_path

    path = resize_request_path(run.config)
    if run.slice.is_local and "://" not in path and not os.path.isabs(path):
        path = os.path.join(os.path.realpath(launch.working_dir), path)
    return path


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError or auth errors
        hint = ""
        if "auth" in str(e).lower() or "token" in str(e).lower():
            hint = (
                " (the cluster uses token authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH, or "
                "RAY_AUTH_TOKEN, to the token `ray start` used)"
            )
        raise LaunchError(f"--address {address}: cannot reach the Ray job API: {type(e).__name__}: {e}{hint}") from e


def submit(job: RayJob, address: str) -> str:
    client = _client(address)
    try:
        return client.submit_job(
            entrypoint=job.entrypoint_command,
            runtime_env=dict(job.runtime_env),
            submission_id=job.submission_id,
            metadata=dict(job.metadata),
        )
    except Exception as e:  # noqa: BLE001 - the job API answers RuntimeError with the server's reason
        raise LaunchError(f"the Ray job API at {address} refused the job: {type(e).__name__}: {e}") from e


def _status(client, submission: str) -> str:
    return str(client.get_job_status(submission)).rsplit(".", 1)[-1]


def follow(submission: str, address: str, out=sys.stdout, poll: float = 1.0) -> str:
    """Streams the job's log until it ends; returns its final status (SUCCEEDED, FAILED or STOPPED)."""
    client = _client(address)

    async def _tail():
        async for chunk in client.tail_job_logs(submission):
            out.write(chunk)
            out.flush()

    asyncio.run(_tail())
    while (status := _status(client, submission)) not in TERMINAL_STATES:  # the stream may end a moment early
        time.sleep(poll)
    return status


def stop(submission: str, address: str, timeout_s: float = 120.0, poll: float = 1.0) -> str:
    """Asks Ray to stop the job and waits for it to end; returns its final status (or its status at the timeout)."""
    client = _client(address)
    client.stop_job(submission)
    deadline = time.monotonic() + timeout_s
    while (status := _status(client, submission)) not in TERMINAL_STATES and time.monotonic() < deadline:
        time.sleep(poll)
    return status


def driver_exit_code(submission: str, address: str) -> Optional[int]:
    """The exit code of the job's driver (``pod.py``), where Ray knows it."""
    try:
        return getattr(_client(address).get_job_info(submission), "driver_exit_code", None)
    except Exception:  # noqa: BLE001 - only refines the launcher's exit code; the job's end was already reported
        return None


def how_to_watch(submission: str, address: str) -> str:
    return "\n".join(
        [
            f"  watch: ray job logs --address {address} --follow {submission}",
            f"  state: ray job status --address {address} {submission}",
            f"  stop:  ray job stop --address {address} {submission}",
        ]
    )
