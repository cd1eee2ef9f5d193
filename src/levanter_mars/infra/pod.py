"""The Ray job's entrypoint, run on the cluster head: one training process per TPU host, via Levanter's
``run_on_pod``, which also restarts the slice after a preemption or a failure (counted separately).

``python -m levanter_mars.infra.pod --tpu_type v4-32 [--num_slices N --retries K --preemption_retries P]
[--secrets NAMES] [--workdir DIR] [--num_hosts H --devices_per_host D] -- <training args>``

Each host runs ``python -m levanter_mars.main.train_lm <training args>`` as a child process (on the local pod
with ``--trainer.distributed.*`` flags and a fresh coordinator port per attempt, see ``rendezvous.py``), so a
crash of the training program is an ordinary failure of the Ray task (retried as a failure), while losing the host
or its Ray worker is a preemption. Every attempt uses the same run id and so resumes from the newest checkpoint.

Only what can succeed on a retry is retried: a crash, a lost host, a preemption. A stop the run decided (a config
error, a non-finite stop, exhausted data, unusable checkpoint storage, a failed eval: ``training/errors.py``) ends the
launch at once with the run's own exit code, and one-shot actions (``fresh=true``) happen once per launch: every
attempt gets this driver's launch id.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import draccus
import ray
from levanter.infra.ray_tpu import run_on_pod

from levanter_mars.compat.ray_jobs import RAY_JOB_CONFIG_JSON_ENV_VAR
from levanter_mars.infra.config import SECRET_METADATA_PREFIX, LaunchError, split_overrides
from levanter_mars.infra.host import LocalHost, host_task
from levanter_mars.infra.local_node import LOCAL_SLICE_SHAPES, slice_name
from levanter_mars.infra.slices import (
    HOST_TASK_CPUS,
    HOST_TASK_MEMORY_BYTES,
    LOCAL_SLICE,
    SliceType,
    head_resource,
    launch_slice,
)
from levanter_mars.training.errors import ExitCode
from levanter_mars.training.outcome import RetryBudget, judge
from levanter_mars.training.run.launch_id import new_launch_id

logger = logging.getLogger("levanter_mars.infra.pod")


@dataclass(frozen=True)
class PodConfig:
    tpu_type: str
    num_slices: int = 1
    retries: int = 3
    preemption_retries: int = 100
    storage_retries: int = 2
    workdir: Optional[str] = None
    """Run training in this directory (the local engine); default: the job's working directory (shipped checkout)."""
    secrets: str = ""
    """Comma-separated names of the credentials the launcher put in the job's metadata."""
    num_hosts: int = 1
    """The local pod's hosts per slice (``--tpu_type cpu``)."""
    devices_per_host: Optional[int] = None
    """The local pod's simulated devices per host (``--tpu_type cpu``)."""
    fresh: bool = False
    """The run asks for ``fresh=true`` (its resolved training config, as the launcher read it)."""


def one_shot_actions_note(pod: PodConfig, launch_id: str) -> Optional[str]:
    """The line that says one-shot actions apply once per launch, for a launch that asked for one (none otherwise)."""
    if not pod.fresh:
        return None
    return f"launch {launch_id}: one-shot actions (fresh=true) apply to its first attempt only"


def take_secrets(names: Sequence[str], environ=os.environ) -> dict[str, str]:
    """Takes the credentials out of the job config Ray's job supervisor hands this driver, before ``ray.init``
    would register them with the cluster. Raises LaunchError if one the launcher sent is not there."""
    config = json.loads(environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR, "{}"))
    metadata = config.get("metadata") or {}
    found = {name: metadata.pop(SECRET_METADATA_PREFIX + name, None) for name in names}
    missing = sorted(name for name, value in found.items() if value is None)
    if missing:
        raise LaunchError(f"credentials {missing} were sent with the job but did not reach its driver")
    if RAY_JOB_CONFIG_JSON_ENV_VAR in environ:
        environ[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps(config)
    return found


def check_local_cluster(resources: dict[str, float], kind: SliceType, num_slices: int = 1) -> None:
    """The local engine's nodes must offer what Levanter's scheduler asks of ``num_slices`` slices of ``kind.hosts``
    hosts, and pose as that many slices (each under its own name) of that many hosts, or the job waits forever; say
    which resource is missing and how to start the nodes."""
    hosts, nodes = kind.hosts, kind.hosts * num_slices
    needed = {
        head_resource(LOCAL_SLICE): num_slices,  # one per slice: Levanter's slice actor holds it
        head_resource(LOCAL_SLICE_SHAPES[hosts][0]): num_slices,  # Ray's, from the pose: the shape of the slice
        **{slice_name(s): hosts for s in range(num_slices)},  # the slice actor places its hosts by the slice's name
        "TPU": kind.chips_per_host * nodes,
        "CPU": HOST_TASK_CPUS * nodes + 1,
        "memory": HOST_TASK_MEMORY_BYTES * nodes,
    }
    missing = {k: v for k, v in needed.items() if resources.get(k, 0) < v}
    if missing:
        from levanter_mars.infra.local_cluster import ray_start_hint

        raise LaunchError(
            f"the Ray cluster cannot run the local engine with {num_slices} slice(s) of {hosts} host(s): it lacks "
            f"{missing} (it has {resources}). Start it with:\n{ray_start_hint(hosts, num_slices)}"
        )


def wait_for_local_cluster(kind: SliceType, num_slices: int = 1, timeout: float = 120.0, poll: float = 1.0) -> None:
    """:func:`check_local_cluster`, allowing the nodes of a cluster that was just started a moment to register."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check_local_cluster(ray.cluster_resources(), kind, num_slices)
        except LaunchError:
            if time.monotonic() > deadline:
                raise
            time.sleep(poll)


def main(argv: Sequence[str]) -> int:
    own, train_argv = split_overrides(argv)
    pod = draccus.parse(PodConfig, args=own)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    local = None
    try:
        kind = launch_slice(pod.tpu_type, pod.num_hosts, pod.devices_per_host)
        secrets = take_secrets([name for name in pod.secrets.split(",") if name])
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    try:
        ray.init()
        if kind.is_local:
            wait_for_local_cluster(kind, pod.num_slices)
            local = LocalHost(kind.hosts, kind.devices_per_host, num_slices=pod.num_slices)
            rendezvous_actor = None  # the handle keeps the actor alive until the run ends
            if local.num_processes > 1:
                from levanter_mars.infra.rendezvous import start_rendezvous

                rendezvous, rendezvous_actor = start_rendezvous(local.num_processes)
                local = dataclasses.replace(local, rendezvous=rendezvous)
    except LaunchError as e:  # the cluster, not the config: a slow or short local cluster is a failure of the launch
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CRASH
    if not kind.is_local and ray.cluster_resources().get(head_resource(kind.name), 0) < pod.num_slices:
        logger.info(
            "waiting for %d x %s: the autoscaler starts slices on demand", pod.num_slices, head_resource(kind.name)
        )

    # max_retries=0: Ray must not silently re-run a host whose worker died; run_on_pod counts that as a preemption
    # and restarts the whole slice. max_calls=1: a fresh worker (and TPU runtime) per attempt, as run_on_pod requires.
    launch_id = new_launch_id()
    if note := one_shot_actions_note(pod, launch_id):
        logger.info(note)
    task = host_task(train_argv, pod.workdir, local, secrets, launch_id)
    remote = ray.remote(max_calls=1, max_retries=0)(task)

    def attempt() -> list[dict]:
        # Preemptions (a lost host or Ray worker) are retried inside run_on_pod, within their budget; every host that
        # ends returns its exit, which run_attempts judges (training/outcome.py).
        return run_on_pod(remote, pod.tpu_type, num_slices=pod.num_slices,
                          max_retries_preemption=pod.preemption_retries, max_retries_failure=0)  # fmt: skip

    return run_attempts(attempt, RetryBudget(failure=pod.retries, preemption=pod.preemption_retries,
                                             storage=pod.storage_retries))  # fmt: skip


def run_attempts(attempt: Callable[[], Sequence[dict]], budget: RetryBudget, say=print) -> int:
    """Runs attempts until the outcome policy ends the launch; returns its exit code. ``attempt()`` returns every
    host's result (``returncode``, ``process``) or raises when Ray gave up on the slice (preemptions past their
    budget, a task that could not run)."""
    used: dict[str, int] = {}
    while True:
        try:
            results = sorted(attempt(), key=lambda r: tuple(r.get("process", (0, 0))))
        except Exception as e:  # noqa: BLE001 - run_on_pod re-raises its last problem when it gives up
            say(f"error: the slice could not run the attempt, gave up: {type(e).__name__}: {e}", file=sys.stderr)
            return ExitCode.CRASH
        verdict = judge([r["returncode"] for r in results], budget, used)
        say(f"launch {verdict.action.replace('_', ' ')}: {verdict.reason}",
            file=sys.stdout if verdict.action == "done" else sys.stderr)  # fmt: skip
        if verdict.ends:
            return verdict.exit_code
        used[verdict.retry_kind] = used.get(verdict.retry_kind, 0) + 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
