"""Where the hosts of one attempt of a local pod learn their coordinator's port.

A TPU pod's hosts find their coordinator by themselves (worker 0, a fixed port). The local pod's hosts all live on
127.0.0.1, and each attempt needs a port nobody holds: a killed attempt's coordinator may linger for a moment, and
other runs share the machine. The job's driver owns one :class:`Rendezvous` actor; every host task asks it for the
port when it starts, and the actor answers all of them at once, with a port it reserved (``ports.py``), when every
host of every slice has asked (hosts are known by their ``jax.distributed`` process id). It holds that reservation
until the next attempt's, since it cannot know when host 0's coordinator has bound the port. A host task of an
earlier attempt that was cancelled while waiting is dead by then (Ray kills the worker of a cancelled task), so it
is recognised by its operating-system pid and left out.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Optional

import psutil
import ray

from levanter_mars.infra.ports import PortLease, reserve_ports


class Rendezvous:
    """All ``num_hosts`` hosts of an attempt (every slice's) get the same fresh port. Async: waiting hosts do not
    block others."""

    def __init__(self, num_hosts: int):
        self._num_hosts = num_hosts
        self._waiting: dict[int, tuple[int, asyncio.Future]] = {}  # process id -> (its task's pid, its answer)
        self._lease: Optional[PortLease] = None  # the latest attempt's port

    async def coordinator_port(self, process_id: int, pid: int) -> int:
        for other, (other_pid, answer) in list(self._waiting.items()):
            if other == process_id or not psutil.pid_exists(other_pid):  # replaced, or left over from a dead attempt
                del self._waiting[other]
                answer.cancel()
        answer = asyncio.get_running_loop().create_future()
        self._waiting[process_id] = (pid, answer)
        if len(self._waiting) == self._num_hosts:
            previous, self._lease = self._lease, reserve_ports(1)
            if previous is not None:  # released after the new one is chosen: an attempt never gets its predecessor's
                previous.release()
            port = self._lease.port
            for _, waiting in self._waiting.values():
                waiting.set_result(port)
            self._waiting.clear()
        return await answer


# Host tasks are started by Levanter's actors and do not share the driver's anonymous namespace: name it.
NAMESPACE = "levanter_mars"


def start_named(actor_class, prefix: str, *args) -> tuple[str, object]:
    """Starts one of the job's actors (no CPU of its own, on one of the cluster's nodes) under a name unique to the
    job, which host tasks find it by; returns the name and its handle: the actor lives as long as the caller holds
    the handle."""
    name = f"{prefix}-{uuid.uuid4().hex}"
    return name, ray.remote(num_cpus=0)(actor_class).options(name=name, namespace=NAMESPACE).remote(*args)


def named(name: str):
    """The job's actor called ``name`` (from a host task)."""
    return ray.get_actor(name, namespace=NAMESPACE)


def start_rendezvous(num_hosts: int) -> tuple[str, object]:
    """Starts the job's rendezvous actor and returns its name and handle (:func:`start_named`)."""
    return start_named(Rendezvous, "rendezvous", num_hosts)


def coordinator_port(name: str, process_id: int) -> int:
    """Asks the job's rendezvous for this attempt's coordinator port (blocks until every host has asked)."""
    return ray.get(named(name).coordinator_port.remote(process_id, os.getpid()))
