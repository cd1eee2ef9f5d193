"""The Ray job's entrypoint, run on the cluster head: one training process per TPU host, via Levanter's
``run_on_pod``, which also restarts the slice after a preemption or a failure (counted separately).

``python -m levanter_mars.infra.pod --tpu_type v4-32 [--num_slices N or 2,1 --retries K --preemption_retries P]
[--scale_up_wait_s S --resize_request PATH] [--secrets NAMES] [--workdir DIR] [--num_hosts H --devices_per_host D]
-- <training args>``

Each host runs ``python -m levanter_mars.main.train_lm <training args>`` as a child process (on the local pod
with ``--trainer.distributed.*`` flags and a fresh coordinator port per attempt, see ``rendezvous.py``), so a
crash of the training program is an ordinary failure of the Ray task (retried as a failure), while losing the host
or its Ray worker is a preemption. Every attempt uses the same run id and so resumes from the newest checkpoint.

Each attempt runs on one slice count (``slice_choice.py``): the largest first, after a preemption the largest whose
slices are up now, and a run on fewer grows back at a checkpoint once slices return (``--num_slices 2,1``).

Only what can succeed on a retry is retried: a crash, a lost host, a preemption, the cluster failing to run an
attempt (on the failure budget), unusable storage (a bounded number of times). A stop the run decided (a config
error, a non-finite stop, exhausted data, a failed eval, the run live elsewhere, a person's interrupt:
``training/errors.py``) ends the launch at once with the run's own exit code, also when a slice was lost with it (each
host posts its end to the attempt's exit board, ``exit_board.py``), and one-shot actions (``fresh=true``) happen once
per launch: every attempt gets this driver's launch id.
"""

from __future__ import annotations

import contextlib
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

from levanter_mars.compat.levanter_infra import SlicesPreempted, run_on_slices
from levanter_mars.compat.ray_jobs import RAY_JOB_CONFIG_JSON_ENV_VAR
from levanter_mars.infra.config import SECRET_METADATA_PREFIX, LaunchError, parse_slice_counts, split_overrides
from levanter_mars.infra.exit_board import start_exit_board
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
from levanter_mars.infra.slice_choice import ScaleUpWatch, change_note, first_count, next_count
from levanter_mars.training.errors import ExitCode, StorageError
from levanter_mars.training.outcome import LOST, NOT_RUN, RESIZE, RetryBudget, Verdict, judge
from levanter_mars.training.run import resize
from levanter_mars.training.run.launch_id import new_launch_id

logger = logging.getLogger("levanter_mars.infra.pod")


@dataclass(frozen=True)
class PodConfig:
    tpu_type: str
    num_slices: str = "1"
    """A count, or the allowed counts of a run that may limp (``2,1``)."""
    scale_up_wait_s: float = 600.0
    """A run on fewer slices than allowed grows back no sooner than this after its attempt started."""
    resize_request: Optional[str] = None
    """Where to ask the run to stop at its next checkpoint (``training/run/resize.py``); none: it never grows back."""
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
        counts = parse_slice_counts(pod.num_slices)
        secrets = take_secrets([name for name in pod.secrets.split(",") if name])
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    try:
        ray.init()
        if kind.is_local:
            wait_for_local_cluster(kind, counts[0])
            local = LocalHost(kind.hosts, kind.devices_per_host)
    except LaunchError as e:  # the cluster, not the config: a slow or short local cluster is a failure of the launch
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CRASH
    if not kind.is_local and slices_up(kind) < counts[0]:
        logger.info("waiting for %d x %s: the autoscaler starts slices on demand", counts[0], head_resource(kind.name))

    launch_id = new_launch_id()
    if note := one_shot_actions_note(pod, launch_id):
        logger.info(note)
    attempt = SliceAttempts(pod, kind, counts, train_argv, local, secrets, launch_id)
    # A resize follows a shrink, which follows a preemption: the preemption budget bounds both.
    budget = RetryBudget(failure=pod.retries, preemption=pod.preemption_retries, storage=pod.storage_retries,
                         resize=pod.preemption_retries)  # fmt: skip
    demand_slices(kind, counts[0])
    try:
        return run_attempts(attempt, budget)
    finally:
        demand_slices(kind, 0)
        if pod.resize_request:
            try:
                resize.clear(pod.resize_request)
            except StorageError as e:  # the launch has its code; a request left behind names this launch only
                logger.warning("%s", e)


def demand_slices(kind: SliceType, count: int) -> None:
    """Asks the cluster's autoscaler to keep ``count`` slices of ``kind`` up for the launch's life (0: done), so that a
    preempted slice is replaced while the run limps or waits: no task of a run on fewer slices asks for it."""
    if kind.is_local:
        return
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{head_resource(kind.name): 1}] * count)


def slices_up(kind: SliceType) -> int:
    """Slices of ``kind`` whose head node is up in the cluster (in use or not)."""
    return int(ray.cluster_resources().get(head_resource(kind.name), 0))


@dataclass
class SliceAttempts:
    """Runs one attempt on every host of the slice count it chooses (``slice_choice.py``); called with the verdict
    on the attempt before (None: the first)."""

    pod: PodConfig
    kind: SliceType
    counts: tuple[int, ...]
    train_argv: Sequence[str]
    local: Optional[LocalHost]
    secrets: dict
    launch_id: str
    slices: Optional[int] = None
    asked: Optional[str] = None

    def __call__(self, previous: Optional[Verdict]) -> list[dict]:
        present = lambda: slices_up(self.kind)  # noqa: E731
        if previous is None:
            slices = first_count(self.counts, present, self.pod.scale_up_wait_s)
        else:
            slices = next_count(self.counts, self.slices, previous.exits, present)
        why = (self.asked if previous.retry_kind == RESIZE else previous.reason) if previous is not None else ""
        change, self.slices, self.asked = change_note(self.slices, slices, why), slices, None
        logger.info("attempt on %d x %s%s", slices, self.kind.name, f" ({change})" if change else "")
        if self.pod.resize_request:
            resize.clear(self.pod.resize_request)
        host, rendezvous_actor = self._local_hosts(slices)  # the actor lives as long as this attempt holds it
        # max_retries=0: Ray must not silently re-run a host whose worker died; it is a preemption (a lost host).
        # max_calls=1: a fresh worker (and TPU runtime) per attempt, as run_on_pod requires.
        board_name, board = start_exit_board()  # what each host decided, should a slice be lost
        task = host_task(self.train_argv, self.pod.workdir, host, self.secrets, self.launch_id, slice_change=change,
                         exit_board=board_name)  # fmt: skip
        remote = ray.remote(max_calls=1, max_retries=0)(task)
        watch = ScaleUpWatch(self.counts, slices, present, self.pod.scale_up_wait_s, self.pod.resize_request or "",
                             self.launch_id)  # fmt: skip
        try:
            with watch if self.pod.resize_request else contextlib.nullcontext():
                return run_on_slices(remote, self.pod.tpu_type, slices)
        except SlicesPreempted as e:
            raise SlicesPreempted(str(e), exits=exits_after_loss(_posted(board), slices * self.kind.hosts)) from e
        finally:  # the watch has ended: what it asked, if anything, is final
            self.asked = watch.asked.reason if watch.asked is not None else None
            del rendezvous_actor, board

    def _local_hosts(self, slices: int) -> tuple[Optional[LocalHost], object]:
        if self.local is None:
            return None, None
        host = dataclasses.replace(self.local, num_slices=slices)
        if host.num_processes == 1:
            return host, None
        from levanter_mars.infra.rendezvous import start_rendezvous

        name, actor = start_rendezvous(host.num_processes)
        return dataclasses.replace(host, rendezvous=name), actor


def _posted(board) -> list[dict]:
    try:
        return ray.get(board.results.remote(), timeout=30)
    except Exception as e:  # noqa: BLE001 - the board went with the slice: every host counts as lost
        logger.warning("could not read the attempt's exit board: %s: %s", type(e).__name__, e)
        return []


def _by_process(results: Sequence[dict]) -> list[dict]:
    return sorted(results, key=lambda r: tuple(r.get("process", (0, 0))))


def exits_after_loss(posted: Sequence[dict], hosts: int) -> list:
    """The exits of an attempt that lost a slice: those the hosts posted (process order), then the rest as lost, so
    that a stop the run decided is judged as such (``training/outcome.py``)."""
    exits = [r["returncode"] for r in _by_process(posted)]
    return exits + [LOST] * max(0, hosts - len(exits))


def run_attempts(attempt: Callable[[Optional[Verdict]], Sequence[dict]], budget: RetryBudget, say=print) -> int:
    """Runs attempts until the outcome policy ends the launch; returns its exit code. ``attempt(verdict on the one
    before)`` returns every host's result (``returncode``, ``process``), raises SlicesPreempted when a slice was
    preempted (with what the hosts that ended reported; the rest are lost hosts), or raises when the cluster could
    not run it at all (a failure, on the failure budget)."""
    used: dict[str, int] = {}
    verdict: Optional[Verdict] = None
    while True:
        try:
            exits = [r["returncode"] for r in _by_process(attempt(verdict))]
        except SlicesPreempted as e:
            say(f"a slice of the attempt was preempted or lost a host: {e}", file=sys.stderr)
            exits = e.exits or [LOST]
        except StorageError as e:  # the driver's own storage step (clearing a resize request): retried as storage
            say(f"error: {e}", file=sys.stderr)
            exits = [ExitCode.CHECKPOINT_STORAGE]
        except Exception as e:  # noqa: BLE001 - run_on_pod re-raises its last problem (a TpuRunError) when it gives up
            say(f"error: the cluster could not run the attempt: {type(e).__name__}: {e}", file=sys.stderr)
            exits = [NOT_RUN]
        verdict = judge(exits, budget, used)
        say(f"launch {verdict.action.replace('_', ' ')}: {verdict.reason}",
            file=sys.stdout if verdict.action == "done" else sys.stderr)  # fmt: skip
        if verdict.ends:
            return verdict.exit_code
        used[verdict.retry_kind] = used.get(verdict.retry_kind, 0) + 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
