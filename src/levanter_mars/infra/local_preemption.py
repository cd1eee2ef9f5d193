"""A TPU slice's preemption on the local engine (``local_cluster.py``), and the slice's return.

``python -m levanter_mars.infra.local_cluster preempt --temp_dir DIR --slice S [--down_s T]``: every Ray node of
slice ``S`` goes away at once, as a preempted slice's VMs do: first the notice, SIGTERM to the slice's training
processes, which save the step every host agrees on and exit 9 (``training/preemption.py``), with up to ``NOTICE_S``
for it, as a spot VM's ~30 s; then each node's raylet and all its descendants (Ray's agents and workers, the host
tasks, a training process still there) get SIGTERM, then SIGKILL after ``GRACE_S``. The command returns once the
cluster's GCS reports those nodes dead (what Levanter's ``run_on_pod`` sees), or, with ``T`` > 0, once the slice is
back ``T`` seconds later: its nodes started again as ``start`` starts them (``LocalRayCluster.start_node``: same node
environment and resources, joining the head's GCS, fresh ports).
``... restore --temp_dir DIR --slice S`` brings a preempted slice back later. Slice 0 is refused: its host 0 is the
cluster's head (GCS, job API), and losing it ends the cluster.

A node's processes are found by its raylet: the one whose command line names the cluster's temp dir and the node's
``--node_manager_port=PORT`` (the port ``start_node`` gave it, kept in the cluster's state file), and the raylet's
descendants, found before any signal (Ray's agents rename themselves ``ray::DashboardAgent`` and name neither).
The command runs as a client of the cluster: Ray reads the authentication mode once, at import, so
:func:`run_as_client` runs it in a fresh process whose environment has the cluster's client settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from levanter_mars.infra.local_cluster import PORT_FLAGS, LocalRayCluster
from levanter_mars.infra.ray_processes import end_processes
from levanter_mars.infra.local_node import slice_name
from levanter_mars.infra.ports import reserve_ports

GRACE_S = 5.0
"""Between SIGTERM and SIGKILL."""
NOTICE_S = 30.0
"""Between the training processes' preemption notice (SIGTERM) and the rest of the slice going, as on a spot VM;
before it, the host tasks would die first and take their training processes with them (``infra/host.py``)."""
GCS_TIMEOUT_S = 120.0
"""How long the GCS may take to report a slice's nodes dead (its health checks) or alive again."""
POLL_S = 0.5
COMMAND = "python -m levanter_mars.infra.local_cluster"
#: Set in the process :func:`run_as_client` starts, a client of the cluster.
AS_CLIENT = "LEVANTER_MARS_PREEMPTION_AS_CLIENT"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["preempt", "restore"])
    where = "what `start` printed, or the launcher in 'starting a private Ray cluster ... in DIR'"
    parser.add_argument("--temp_dir", required=True, help=f"the cluster's directory ({where})")
    parser.add_argument("--slice", type=int, required=True, help="the slice: 1 .. S-1 (slice 0 holds the head)")
    parser.add_argument("--down_s", type=float, default=0.0, help="preempt: back after T seconds (0: stays down)")
    return parser


def run_as_client(argv: Sequence[str]) -> int:
    """:func:`main` in a process with the cluster's client environment (this one may have imported Ray already)."""
    args = _parser().parse_args(argv)
    try:
        cluster = LocalRayCluster.load(args.temp_dir)
    except FileNotFoundError:
        return _refuse(args, f"--temp_dir {args.temp_dir}: no local cluster's state file there")
    if why := refusal(args, cluster) or gone(cluster):  # refused here, before a second import of Ray and the rest
        return _refuse(args, why)
    sys.stdout.flush()
    env = {**os.environ, **cluster.client_env(), AS_CLIENT: "1"}
    os.execve(sys.executable, [sys.executable, "-m", "levanter_mars.infra.local_preemption", *argv], env)


def slice_nodes(cluster: LocalRayCluster, slice_id: int) -> range:
    return range(slice_id * cluster.num_hosts, (slice_id + 1) * cluster.num_hosts)


def alive_nodes(cluster: LocalRayCluster, slice_id: int) -> int:
    """How many nodes of the slice the cluster's GCS reports alive (through the head's state API)."""
    from ray.util.state import list_nodes

    nodes = list_nodes(address=cluster.address, limit=10_000, timeout=30)  # filters=: a "truncation" error
    return sum(node.state == "ALIVE" and slice_name(slice_id) in node.resources_total for node in nodes)


def wait_for_gcs(cluster: LocalRayCluster, slice_id: int, alive: int) -> float:
    """Seconds until the GCS reports ``alive`` nodes of the slice alive; TimeoutError after GCS_TIMEOUT_S."""
    start = time.monotonic()
    while (now := alive_nodes(cluster, slice_id)) != alive:
        if time.monotonic() - start > GCS_TIMEOUT_S:
            raise TimeoutError(
                f"after {GCS_TIMEOUT_S:.0f} s the cluster's GCS still reports {now} node(s) of slice {slice_id} "
                f"alive, not {alive} (Ray's logs: {cluster.temp_dir}/session_latest/logs)"
            )
        time.sleep(POLL_S)
    return time.monotonic() - start


def node_processes(cluster: LocalRayCluster, node: int) -> list:
    """The node's raylet (see the module's docstring) and its descendants; RuntimeError if there is no such raylet."""
    import psutil

    flag = f"--node_manager_port={cluster.node_manager_ports[node]}"
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or ()
        if cmdline and os.path.basename(cmdline[0]) == "raylet" and flag in cmdline:
            if any(cluster.temp_dir in arg for arg in cmdline):
                try:
                    return [proc, *proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    break
    raise RuntimeError(f"no raylet of node {node} (cmdline {flag}, {cluster.temp_dir}) is running")


def training_processes(procs: Sequence) -> list:
    """Those of ``procs`` (psutil processes) that run the training program."""
    from levanter_mars.infra.host import TRAIN_MODULE
    from levanter_mars.infra.ray_processes import command_line

    return [proc for proc in procs if TRAIN_MODULE in command_line(proc)]


def preempt(cluster: LocalRayCluster, slice_id: int) -> None:
    trees = [node_processes(cluster, node) for node in slice_nodes(cluster, slice_id)]
    procs, raylets = [proc for tree in trees for proc in tree], [tree[0].pid for tree in trees]
    signalled = time.monotonic()
    training = training_processes(procs)
    killed = end_processes(training, NOTICE_S)
    noticed_after = time.monotonic() - signalled
    killed += end_processes([proc for proc in procs if proc not in training], GRACE_S)
    gone_after = time.monotonic() - signalled
    dead_after = gone_after + wait_for_gcs(cluster, slice_id, alive=0)
    print(f"preempted slice {slice_id} ({slice_name(slice_id)}, {cluster.num_hosts} node(s)): the notice (SIGTERM) "
          f"to its {len(training)} training process(es), gone after {noticed_after:.1f} s; SIGTERM to "
          f"{len(procs)} process(es) (raylet(s) {raylets} and their descendants), SIGKILL to {killed} after the "
          f"{GRACE_S:g} s grace; all gone after {gone_after:.1f} s, the node(s) dead in the cluster's GCS after "
          f"{dead_after:.1f} s", flush=True)  # fmt: skip


def restore(cluster: LocalRayCluster, slice_id: int) -> None:
    """The slice's nodes started again (fresh ports, reserved until each ``ray start`` has returned)."""
    with reserve_ports(cluster.num_hosts * len(PORT_FLAGS)) as lease:
        ports = iter(lease.ports)
        for node in slice_nodes(cluster, slice_id):
            cluster.start_node(node, ports, os.environ)
            cluster.save()  # each node as it starts: `stop` finds them by temp dir anyway
    alive_after = wait_for_gcs(cluster, slice_id, alive=cluster.num_hosts)
    print(f"slice {slice_id} ({slice_name(slice_id)}) is back: {cluster.num_hosts} node(s) alive in the cluster's "
          f"GCS {alive_after:.1f} s after their `ray start` returned", flush=True)  # fmt: skip


def refusal(args: argparse.Namespace, cluster: LocalRayCluster) -> str:
    """Why the command must not run ('' if it may), from the state file alone."""
    slices = f"the cluster in {cluster.temp_dir} has {cluster.num_slices} slice(s) x {cluster.num_hosts} host(s)"
    if args.slice == 0:
        others = f"preempt one of slices 1..{cluster.num_slices - 1}" if cluster.num_slices > 1 else "no other slice"
        return (f"--slice 0: slice 0's host 0 is the cluster's head (its GCS and job API): preempting it ends the "
                f"cluster, it does not preempt a slice ({slices}: {others})")  # fmt: skip
    if not 0 < args.slice < cluster.num_slices:
        return f"--slice {args.slice}: no such slice ({slices}, numbered 0..{cluster.num_slices - 1})"
    if args.down_s < 0 or (args.down_s and args.command == "restore"):
        return f"--down_s {args.down_s:g}: preempt's seconds until the slice is back (>= 0; not for restore)"
    if len(cluster.node_manager_ports) != cluster.num_slices * cluster.num_hosts:
        return f"{cluster.temp_dir}: its state file names no node's ports (started by an older version): restart it"
    return ""


def gone(cluster: LocalRayCluster) -> str:
    """Why the cluster cannot be asked ('' if it runs): its state file outlives it (the launcher keeps a private
    cluster's directory, its logs, after a run that did not finish; the cluster itself it stops)."""
    if cluster.is_running():
        return ""
    return (f"that cluster is gone: no process of the cluster in {cluster.temp_dir} runs (the launcher stops its "
            f"private cluster when it ends; its directory keeps Ray's logs). Start a new one, or launch again")


def gcs_refusal(args: argparse.Namespace, cluster: LocalRayCluster) -> str:
    """Why the command must not run now ('' if it may): preempt needs the slice up, restore needs it down."""
    up = alive_nodes(cluster, args.slice)
    if args.command == "preempt" and not up:
        return f"--slice {args.slice}: slice {args.slice} is down already (`restore` brings it back)"
    if args.command == "restore" and up:
        return f"--slice {args.slice}: slice {args.slice} is up ({up} of {cluster.num_hosts} node(s) alive)"
    return ""


def _refuse(args: argparse.Namespace, why: str) -> int:
    print(f"{COMMAND} {args.command}: {why}", file=sys.stderr)
    return 2


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    cluster = LocalRayCluster.load(args.temp_dir)
    if why := refusal(args, cluster) or gone(cluster) or gcs_refusal(args, cluster):
        return _refuse(args, why)
    try:
        if args.command == "preempt":
            preempt(cluster, args.slice)
            if not args.down_s:
                print(f"slice {args.slice} stays down; bring it back with: {COMMAND} restore --temp_dir "
                      f"{cluster.temp_dir} --slice {args.slice}")  # fmt: skip
                return 0
            print(f"slice {args.slice}: back in {args.down_s:g} s", flush=True)
            time.sleep(args.down_s)
        restore(cluster, args.slice)
    except (TimeoutError, RuntimeError) as error:
        print(f"{COMMAND} {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if os.environ.get(AS_CLIENT) else run_as_client(sys.argv[1:]))
