"""``python -m levanter_mars.infra.launch --config_path config/X.yaml --tpu_type v4-32 [--num_slices N or 2,1]
[--retries K] [--preemption_retries P] [--address http://...] [--dry_run] [--skip_preflight] [-- overrides]``

Submits the run as a Ray job (one training process per TPU host, restarted after preemptions and failures) and
follows its log. First, here, the TPU compiler compiles the train step for the slice (``main/preflight.py``): a step
that does not fit is refused before anything is submitted, and the dry run shows the pre-flight table.
``--tpu_type cpu [--num_slices S --num_hosts N --devices_per_host D]`` runs it as a local pod on this machine
(S slices of N hosts, one Ray node and one training process per host):
on the Ray cluster ``--address`` (or ``$RAY_ADDRESS``) names, else on a private one started on 127.0.0.1 for this
command and stopped when it ends (see ``local_cluster.py``). See infra/README.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from typing import Optional, Sequence

# The launcher plans and submits; it never computes, and on a TPU VM it must not take the chips its own run's host
# needs: the hosts' training processes choose their own platform (the local engine's are CPUs anyway). (On a machine
# without a TPU no command probes for one: levanter_mars/__init__.py, compat defect 48.)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from levanter_mars.infra.config import LaunchError, RayLaunchConfig, parse_args  # noqa: E402
from levanter_mars.infra.local_node import LOCAL_SLICE  # noqa: E402
from levanter_mars.infra.preflight.launch_check import preflight_run, take_skip_flag  # noqa: E402

# Light imports only above this line: Ray reads its authentication mode once, when it is imported, and a private
# cluster's client must be in token mode by then (see cli). plan and ray_job import Levanter, and so Ray.

PRIVATE_CLUSTER = "a private Ray cluster on 127.0.0.1, started for this command and stopped when it ends"


def wants_private_cluster(launch: RayLaunchConfig, environ=os.environ) -> bool:
    return launch.tpu_type == LOCAL_SLICE and not launch.address and not environ.get("RAY_ADDRESS")


def run_job(job, address: str, launch: RayLaunchConfig, label: str, private: bool = False) -> int:
    """Submits ``job`` and (unless ``--follow false``) streams its log; returns the launcher's exit code."""
    from levanter_mars.infra.ray_job import driver_exit_code, follow, how_to_watch, stop, submit

    try:
        submission = submit(job, address)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"submitted Ray job {submission} to {address} ({label})")
    if not launch.follow and not private:
        print(how_to_watch(submission, address))
        return 0
    previous = signal.signal(signal.SIGTERM, _interrupt) if not private else None
    try:
        status = follow(submission, address)
    except KeyboardInterrupt as e:
        if private:
            raise  # the private cluster, and the job with it, is stopped on the way out
        code = 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
        if launch.stop_job_on_interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the stop
            print(f"\ninterrupted: stopping Ray job {submission}", file=sys.stderr)
            print(f"Ray job {submission}: {stop(submission, address)}", file=sys.stderr)
            return code
        print(f"\nstopped following; the job goes on:\n{how_to_watch(submission, address)}", file=sys.stderr)
        return code
    except Exception as e:  # noqa: BLE001 - a dropped log stream (tunnel closed, laptop asleep) ends only the watching
        print(f"lost the job's log ({type(e).__name__}: {e}); the job goes on:\n{how_to_watch(submission, address)}",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"Ray job {submission}: {status}")
    if status == "SUCCEEDED":
        return 0
    return launch_exit_code(driver_exit_code(submission, address))


def launch_exit_code(driver_code: Optional[int]) -> int:
    """The driver ends with the run's own exit code when the run stopped for a reason it decided (a config error, a
    non-finite stop, ...: training/errors.py), and so does the launcher; anything else is a failure (1)."""
    from levanter_mars.training.errors import DECIDED_STOPS

    return driver_code if driver_code in DECIDED_STOPS else 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (the private cluster is stopped), but reported as itself: exit 143, not 130."""


def _interrupt(signum, frame):
    raise Terminated(signal.Signals(signum).name)


def run_on_private_cluster(job, launch: RayLaunchConfig, hosts: int, label: str, temp_dir: str) -> int:
    """Starts a local Ray cluster of ``launch.num_slices`` slices of ``hosts`` nodes in ``temp_dir``, runs the job
    on it, and stops it (also after an error, Ctrl-C or SIGTERM): the local pod as one command."""
    from levanter_mars.infra.local_cluster import LocalRayCluster

    slices = launch.max_slices
    shape = f"{hosts} host(s)" if slices == 1 else f"{slices} slices x {hosts} host(s)"
    print(f"starting {PRIVATE_CLUSTER} ({shape}) in {temp_dir}", flush=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    cluster, code = None, 1
    try:
        cluster = LocalRayCluster.start(temp_dir, num_hosts=hosts, num_slices=slices)
        code = run_job(job, cluster.address, launch, label, private=True)
    except KeyboardInterrupt as e:
        print("\ninterrupted: stopping the private Ray cluster and the run on it", file=sys.stderr)
        code = 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except RuntimeError as e:  # ray start failed
        print(f"error: {e}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the cleanup
        try:
            if cluster is not None:
                cluster.stop()
            if code == 0:
                shutil.rmtree(temp_dir, ignore_errors=True)
            else:
                print(f"Ray's logs of the run are kept in {temp_dir}", file=sys.stderr)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return code


def _client_of_private_cluster(environ=os.environ) -> str:
    """Makes this process a client of the private cluster about to start in the returned directory. Must run before
    Ray is imported (it reads the authentication mode then)."""
    from levanter_mars.infra.local_node import client_environment, new_temp_dir

    if "ray" in sys.modules:
        raise LaunchError("internal: Ray was imported before the launcher could set up its private cluster's client")
    temp_dir = new_temp_dir()
    environ.update(client_environment(temp_dir))
    return temp_dir


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    skip_preflight, argv = take_skip_flag(argv)
    temp_dir = None
    try:
        launch, _ = parse_args(argv, RayLaunchConfig)
        if not launch.dry_run and wants_private_cluster(launch):
            temp_dir = _client_of_private_cluster()
    except LaunchError:
        pass  # prepare_cli reports it

    from levanter_mars.infra.plan import prepare_cli
    from levanter_mars.infra.ray_job import build_job, resolve_address

    prepared = prepare_cli(argv, RayLaunchConfig)
    if isinstance(prepared, int):
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        return prepared
    launch, run = prepared
    preflight_code, preflight_text = preflight_run(run, launch.working_dir, skip_preflight)
    if preflight_code != 0:
        print(f"error: pre-flight {preflight_text}", file=sys.stderr)
        return preflight_code
    job = build_job(run, launch)
    address = PRIVATE_CLUSTER if temp_dir or (launch.dry_run and wants_private_cluster(launch)) else None
    address = address or resolve_address(launch.address)
    if launch.dry_run:
        print(run.report({"address": address, "preflight": preflight_text, "ray_job": job.printable()}))
        return 0
    label = f"run {run.run_id}, {run.slice.name} x {run.job.num_slices}"  # 2,1: limping between 2 and 1
    if run.slice.is_local:
        label += f", {run.slice.hosts} host(s) x {run.slice.devices_per_host} device(s)"
    if temp_dir:
        return run_on_private_cluster(job, launch, run.slice.hosts, label, temp_dir)
    return run_job(job, address, launch, label)


if __name__ == "__main__":
    sys.exit(cli())
