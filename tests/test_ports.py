"""Ports for local pods and clusters (levanter_mars/infra/ports.py): no two choosers hand out one port, whatever
process they are in, and a port someone listens on is never handed out."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from levanter_mars.infra import ports
from tests.helpers.training import REPO

#: A chooser in another process: reserves one of the given ports, or says none was free.
OTHER_PROCESS = """
import sys
from levanter_mars.infra.ports import reserve_ports
try:
    print(reserve_ports(1, [int(p) for p in sys.argv[1:]]).port)
except RuntimeError:
    print("none")
"""


def _reserve_elsewhere(candidates) -> str:
    proc = subprocess.run([sys.executable, "-c", OTHER_PROCESS, *map(str, candidates)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO / "src"), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_reserved_port_is_handed_out_to_no_other_chooser_until_released():
    held = ports.reserve_ports(3)
    assert len(set(held.ports)) == 3
    try:
        with pytest.raises(RuntimeError, match="no 1 free ports among 3"):
            ports.reserve_ports(1, held.ports)  # another lease of this process
        assert _reserve_elsewhere(held.ports) == "none"  # a chooser in another process (a test worker, a launcher)
    finally:
        held.release()
    assert int(_reserve_elsewhere(held.ports)) in held.ports, "released: anyone may have it"


def test_a_port_a_listener_holds_is_skipped():
    """A gRPC server (jax.distributed's coordinator) listens with SO_REUSEPORT, on every address: still taken."""
    free = ports.reserve_ports(2)
    listened, other = free.ports
    free.release()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("::", listened))
        listener.listen()
        with ports.reserve_ports(1, [listened, other]) as lease:
            assert lease.ports == (other,)
        with pytest.raises(RuntimeError):
            ports.reserve_ports(1, [listened])


def test_candidates_are_ports_the_kernel_and_ray_never_give_anyone():
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = ports.candidate_ports()
    assert len(candidates) > 1000
    assert all(ports.RAY_WORKER_PORTS_END < p < low for p in (candidates[0], candidates[-1])), candidates
    with ports.reserve_ports(4) as lease:
        assert all(p in candidates for p in lease.ports)
