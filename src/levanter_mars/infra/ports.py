"""Ports for the listeners of local pods and clusters on one machine, chosen without a race between their choosers.

Binding port 0 and closing the socket before the listener binds (what this replaced) races every other process: the
kernel hands a closed port to the next ``bind(0)`` or outgoing connection of anyone, and two test workers can be told
the same port. For ``jax.distributed`` that is a hang, not an error: its coordinator is a gRPC server, and gRPC sets
``SO_REUSEPORT``, so a second pod's coordinator told the same port binds it too and the kernel splits the hosts'
connections between the two (checked: two coordinators bind one port; one over a plain listener crashes).

The alternatives do not fit every listener here. Port 0 in the listener itself: every host of a pod must know the
coordinator's address before the coordinator starts, and ``ray start`` has fixed defaults (10001, 52365, ...) for
listeners it does not report back. Holding the chosen port with ``SO_REUSEPORT`` until the listener binds: Ray's gRPC
servers turn ``SO_REUSEPORT`` off (so that two raylets cannot share a port), so they could not bind a held port.

So a port is reserved, by a :class:`PortLease`, when all three hold:

1. it lies below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) and above Ray's worker
   ports (10002-19999 by default): the kernel never gives it to a ``bind(0)`` or an outgoing connection, and no Ray
   worker binds it;
2. this lease holds an exclusive ``flock`` on a file named after it, in a directory every chooser on the machine
   shares, until the listener has bound it (a pod's life, a cluster's start): no two choosers hand it out at once, and
   a lease dies with its process;
3. a ``bind`` to it succeeds now: a port a listener holds (a lingering coordinator of a killed attempt, a cluster
   started by another command whose lease has ended) is skipped.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
from pathlib import Path
from typing import Optional, Sequence

#: Ray's default worker ports (``ray start --min-worker-port/--max-worker-port``): chosen ports stay above them.
RAY_WORKER_PORTS_END = 19999
#: The kernel's default ephemeral range, where /proc does not say.
DEFAULT_EPHEMERAL = (32768, 60999)


def lock_directory() -> Path:
    """One directory for every chooser of this user on the machine (not $TMPDIR, which tests and runs may change)."""
    return Path("/tmp", f"levanter-mars-ports-{os.getuid()}")


def candidate_ports() -> range:
    """Ports outside the kernel's ephemeral range and above Ray's worker ports; below the range where there is room."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = DEFAULT_EPHEMERAL
    below = range(RAY_WORKER_PORTS_END + 1, low)
    above = range(max(high + 1, RAY_WORKER_PORTS_END + 1), 65536)
    return below if len(below) >= len(above) else above


def _bindable(port: int) -> bool:
    """Nobody listens on, or holds, ``port`` (any address: a listener on [::] or 0.0.0.0 takes 127.0.0.1 too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class PortLease:
    """``ports``, reserved for this lease's holder until :meth:`release` (or its process ends)."""

    def __init__(self, ports: Sequence[int], files: Sequence[int]):
        self.ports, self._files = tuple(ports), list(files)

    @property
    def port(self) -> int:
        (port,) = self.ports
        return port

    def release(self) -> None:
        for fd in self._files:
            os.close(fd)  # closing the lock file ends its flock
        self._files = []

    def __enter__(self) -> "PortLease":
        return self

    def __exit__(self, *_) -> None:
        self.release()


def reserve_ports(count: int = 1, candidates: Optional[Sequence[int]] = None) -> PortLease:
    """``count`` distinct ports, reserved (see the module's docstring) until the lease is released."""
    candidates = candidate_ports() if candidates is None else candidates
    directory = lock_directory()
    directory.mkdir(mode=0o700, exist_ok=True)
    start = random.SystemRandom().randrange(len(candidates))  # choosers spread out instead of queueing on one port
    ports, files = [], []
    for i in range(len(candidates)):
        port = candidates[(start + i) % len(candidates)]
        fd = os.open(directory / str(port), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another lease holds it
            os.close(fd)
            continue
        if not _bindable(port):
            os.close(fd)
            continue
        ports.append(port)
        files.append(fd)
        if len(ports) == count:
            return PortLease(ports, files)
    PortLease(ports, files).release()
    raise RuntimeError(f"no {count} free ports among {len(candidates)} candidates (leases in {directory})")
