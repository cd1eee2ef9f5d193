"""The local engine: a Ray cluster on this machine, bound to 127.0.0.1, that runs ``--tpu_type cpu`` jobs through
exactly the code path a TPU pod uses (Levanter's ``run_on_pod``), with one Ray node per simulated host.

With ``S`` slices of ``H`` hosts, node ``s * H + w`` poses as worker ``w`` of slice ``s``, a v4 slice of ``H`` hosts
named ``local-cpu`` (slice 0) or ``local-cpu-<s>`` (the ``TPU_*`` variables Ray reads on GKE name it, see
``local_node.py``), so neither Ray nor Levanter asks the GCE metadata server anything, and it offers the resources
Levanter's scheduler requests (``TPU-cpu-head`` on worker 0 of each slice, ``TPU`` chips, 8 CPUs and 20 GB per host
task: logical amounts, not a promise of hardware). Ray's own traps on such a machine are handled here:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every listener on 127.0.0.1, the dashboard's cloud probes and usage
ping go to a closed loopback port (``local_node.py``), and token authentication is on, with the mode set the same
way for the nodes and their clients.

``python -m levanter_mars.infra.local_cluster start|stop|env [--temp_dir DIR] [--num_hosts N] [--num_slices S]``.
``stop`` ends only the processes of the cluster in DIR (never ``ray stop``, which ends every Ray on the machine).
``preempt|restore --temp_dir DIR --slice S``: a slice's preemption, and its return (``local_preemption.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from levanter_mars.infra.local_node import (
    LOOPBACK_ONLY,
    NODE_ENVIRONMENT,
    TOKEN_FILE,
    client_environment,
    new_temp_dir,
    node_environment,
    node_position,
)
from levanter_mars.compat.ray_local_nodes import own_tpu_log_dir
from levanter_mars.infra.ports import PortLease, reserve_ports
from levanter_mars.infra.ray_processes import end_ray_processes, interrupt_processes

# slices.py (it imports Levanter and Ray: seconds) is imported where used: `stop`, `env`, `preempt` do without it.

JOIN_MODULE = "levanter_mars.compat.ray_local_nodes"
STATE_FILE = "levanter_mars_cluster.json"
OBJECT_STORE_BYTES = 200 * 10**6  # the launcher moves no data through Ray: keep /dev/shm use small


def node_resources(worker_id: int = 0) -> dict[str, float]:
    from levanter_mars.infra.slices import LOCAL_SLICE, head_resource, local_slice

    chips = {"TPU": local_slice().chips_per_host}
    return {**chips, head_resource(LOCAL_SLICE): 1} if worker_id == 0 else chips


def ray_start_args(
    *,
    gcs_port: int = 6379,
    dashboard_port: int = 8265,
    temp_dir: Optional[str] = None,
    extra_ports: Optional[Mapping[str, int]] = None,
    worker_id: int = 0,
    head_address: Optional[str] = None,
) -> list[str]:
    """``ray start`` for a node of the local engine: the head (host 0), or with ``head_address`` (its GCS) host
    ``worker_id`` joining it. Ports and temp dir are for running several clusters side by side."""
    from levanter_mars.infra.slices import HOST_TASK_CPUS, HOST_TASK_MEMORY_BYTES

    if head_address is None:
        node = [
            "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs_port),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        ]  # fmt: skip
    else:  # one log monitor per machine (the head's reads every node's logs here), or each line comes N times
        node = ["--address", head_address, "--node-ip-address", "127.0.0.1", "--include-log-monitor", "false"]
    args = [
        "ray", "start", *node,
        "--num-cpus", str(HOST_TASK_CPUS + 1),
        "--memory", str(HOST_TASK_MEMORY_BYTES + 10**9),
        "--object-store-memory", str(OBJECT_STORE_BYTES),
        "--resources", json.dumps(node_resources(worker_id), separators=(",", ":")),
        "--disable-usage-stats",
    ]  # fmt: skip
    for flag, port in (extra_ports or {}).items():
        args += [f"--{flag}", str(port)]
    if temp_dir:
        args += ["--temp-dir", temp_dir]
    return args


def ray_start_hint(num_hosts: int = 1, num_slices: int = 1) -> str:
    if num_slices > 1:
        command = "python -m levanter_mars.infra.local_cluster start"
        return f"  {command} --num_hosts {num_hosts} --num_slices {num_slices}   (see infra/README.md)"
    if num_hosts > 1:
        return f"  python -m levanter_mars.infra.local_cluster start --num_hosts {num_hosts}   (see infra/README.md)"
    env = " ".join(f"{k}={v}" for k, v in {**LOOPBACK_ONLY, "RAY_AUTH_MODE": "token", **NODE_ENVIRONMENT}.items())
    return f"  {env} \\\n    {shlex.join(ray_start_args())}"


# `ray start` flags of the listeners a second cluster on the machine would otherwise collide on.
PORT_FLAGS = ("ray-client-server-port", "node-manager-port", "object-manager-port", "metrics-export-port",
               "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port")  # fmt: skip


@dataclass
class LocalRayCluster:
    """A local-engine cluster (one node per simulated host, ``num_hosts`` per slice) in its own temp dir, ports
    and auth token; stopped by its own process ids. Its ports are reserved (``ports.py``) until it is stopped, or
    until the process that started it ends (``start`` on the command line: once every ``ray start`` has returned)."""

    temp_dir: str
    gcs_port: int = 0
    dashboard_port: int = 0
    num_hosts: int = 1
    num_slices: int = 1
    pids: list[int] = field(default_factory=list)
    node_manager_ports: list[int] = field(default_factory=list)  # node i's raylet: how its processes are found
    ports: Optional[PortLease] = field(default=None, repr=False, compare=False)

    @property
    def address(self) -> str:
        """The job API (what the launcher's ``--address`` takes)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def token_path(self) -> str:
        return os.path.join(self.temp_dir, TOKEN_FILE)

    def client_env(self) -> dict[str, str]:
        """What a client (the launcher, ``ray job ...``) needs in its environment to reach this cluster."""
        return {**client_environment(self.temp_dir), "RAY_ADDRESS": self.address}

    @classmethod
    def start(
        cls,
        temp_dir: Optional[str] = None,
        environ: Optional[Mapping[str, str]] = None,
        timeout: float = 120,
        num_hosts: int = 1,
        num_slices: int = 1,
    ):
        from levanter_mars.infra.slices import check_local_nodes, local_slice

        local_slice(num_hosts)  # a pod shape the nodes can pose as, or LaunchError
        check_local_nodes(num_hosts, num_slices)
        temp_dir = temp_dir or new_temp_dir()
        os.makedirs(temp_dir, exist_ok=True)
        nodes = num_hosts * num_slices
        lease = reserve_ports(2 + nodes * len(PORT_FLAGS))
        ports = iter(lease.ports)
        cluster = cls(os.path.realpath(temp_dir), next(ports), next(ports), num_hosts, num_slices, ports=lease)
        with open(os.open(cluster.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        environ = environ if environ is not None else os.environ
        # Ray refuses to add a node while its listeners are kept on 127.0.0.1: see the compat module.
        try:
            for node in range(nodes):  # the cluster's head (slice 0's host 0) first: the others join it
                cluster.start_node(node, ports, environ, timeout)
        except BaseException:
            cluster.stop()
            raise
        cluster.pids = cluster._find_pids()
        cluster.save()
        return cluster

    def start_node(self, node: int, ports: Iterator[int], environ: Mapping[str, str], timeout: float = 120) -> None:
        """``ray start`` of the ``node``-th node (node 0: the head; the others join its GCS) on ``ports``."""
        slice_id, worker_id = node_position(node, self.num_hosts)
        extra_ports = {flag: next(ports) for flag in PORT_FLAGS}
        head = self.gcs_address if node else None
        args = ray_start_args(gcs_port=self.gcs_port, dashboard_port=self.dashboard_port, temp_dir=self.temp_dir,
                              extra_ports=extra_ports, worker_id=worker_id, head_address=head)  # fmt: skip
        env = {**environ, **self.client_env(), **node_environment(self.num_hosts, worker_id, slice_id),
               **own_tpu_log_dir(self.temp_dir)}  # fmt: skip
        env.pop("RAY_ADDRESS")  # a node joins the cluster its command line names, no other
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        command = [ray_bin, *args[1:]] if node == 0 else [sys.executable, "-m", JOIN_MODULE, *args[1:]]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start of slice {slice_id}'s host {worker_id} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")  # fmt: skip
        self.node_manager_ports[node:node + 1] = [extra_ports["node-manager-port"]]  # start appends, restore replaces

    def _is_own(self, cmdline: Sequence[str]) -> bool:
        """Ray's daemons started with this cluster's temp dir; and its client server (``ray.util.client.server
        --mode=proxy``), which names neither the temp dir nor a ``/ray/`` path and outlives ``ray start``, orphaned,
        but is started with this cluster's own GCS address."""
        if any(self.temp_dir in arg for arg in cmdline) and any("/ray/" in arg for arg in cmdline):
            return True
        return "ray.util.client.server" in cmdline and f"--address={self.gcs_address}" in cmdline

    def _find_pids(self) -> list[int]:
        """Every process of this cluster (:meth:`_is_own`) and all their descendants (workers, job drivers,
        training processes)."""
        import psutil

        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or ()
            try:
                if self._is_own(cmdline):
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return sorted(found)

    def save(self) -> None:
        state = {
            "temp_dir": self.temp_dir,
            "gcs_port": self.gcs_port,
            "dashboard_port": self.dashboard_port,
            "num_hosts": self.num_hosts,
            "num_slices": self.num_slices,
            "node_manager_ports": self.node_manager_ports,
        }
        Path(self.temp_dir, STATE_FILE).write_text(json.dumps(state))

    @classmethod
    def load(cls, temp_dir: str) -> LocalRayCluster:
        state = json.loads(Path(temp_dir, STATE_FILE).read_text())
        return cls(**state)

    def stop(self, grace: float = 10.0) -> list[int]:
        """Terminates this cluster's processes (found again now: workers come and go), then kills stragglers. The
        training processes on it first get a person's interrupt, as a Ctrl-C of the command would give them, and
        ``grace`` s to act on it: each releases its run's lease and records its end (exit 130); killed with their
        Ray worker (``host.py``: they die with their parent), they would leave both behind."""
        import psutil

        procs = []
        for pid in set(self.pids) | set(self._find_pids()):
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        interrupt_processes([p for p in procs if is_training_process(p)], grace)
        end_ray_processes(procs, grace)
        if self.ports is not None:
            self.ports.release()
        return sorted(p.pid for p in procs)

    def is_running(self) -> bool:
        return bool(self._find_pids())


def is_training_process(proc) -> bool:
    """Whether ``proc`` (psutil) runs the training program (``python -m levanter_mars.main.train_lm``, as a host task
    starts it)."""
    import psutil

    from levanter_mars.infra.host import TRAIN_MODULE

    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return cmdline[1:3] == ["-m", TRAIN_MODULE]


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m levanter_mars.infra.local_cluster", description=__doc__.split("\n\n")[0]
    )
    if argv[:1] in (["preempt"], ["restore"]):  # local_preemption.py, which imports this module: no circle
        os.execv(sys.executable, [sys.executable, "-m", "levanter_mars.infra.local_preemption", *argv])
    parser.add_argument("command", choices=["start", "stop", "env", "preempt", "restore"])
    parser.add_argument("--temp_dir", default=None, help="the cluster's directory (start: default a new one in /tmp)")
    parser.add_argument("--num_hosts", type=int, default=1, help="start: hosts per slice (1, 2, 4, 8)")
    parser.add_argument("--num_slices", type=int, default=1, help="start: slices of --num_hosts hosts each")
    args = parser.parse_args(argv)
    if args.command == "start":
        cluster = LocalRayCluster.start(args.temp_dir, num_hosts=args.num_hosts, num_slices=args.num_slices)
        print(f"# local Ray cluster ({cluster.num_slices} slice(s) x {cluster.num_hosts} host(s)) up in "
              f"{cluster.temp_dir}; point clients at it with:")  # fmt: skip
        for k, v in cluster.client_env().items():
            print(f"export {k}={shlex.quote(v)}")
        print(f"# stop it with: python -m levanter_mars.infra.local_cluster stop --temp_dir {cluster.temp_dir}")
        return 0
    if not args.temp_dir:
        parser.error(f"{args.command} needs --temp_dir (the directory `start` printed)")
    cluster = LocalRayCluster.load(args.temp_dir)
    if args.command == "env":
        for k, v in cluster.client_env().items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    stopped = cluster.stop()
    print(f"stopped {len(stopped)} process(es) of the cluster in {cluster.temp_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
