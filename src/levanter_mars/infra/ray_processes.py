"""Ending a local Ray cluster's processes (``local_cluster.py``, ``local_preemption.py``): SIGTERM, then SIGKILL
to what is left after a grace."""

from __future__ import annotations

import contextlib
import signal
from typing import Sequence


def name_of(proc) -> str:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.name()
    return ""


def command_line(proc) -> str:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        return " ".join(proc.cmdline())
    return ""


def descendants(proc) -> list:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.children(recursive=True)
    return []


def end_processes(procs: Sequence, grace: float) -> int:
    """SIGTERM to ``procs`` (psutil processes), SIGKILL to those alive ``grace`` s later; how many needed it."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)
    return len(alive)


def interrupt_processes(procs: Sequence, grace: float) -> None:
    """SIGINT (a person's Ctrl-C) to ``procs``, and up to ``grace`` s for them to end by themselves."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGINT)
    psutil.wait_procs(procs, timeout=grace)


def end_ray_processes(procs: Sequence, grace: float) -> None:
    """A cluster's processes, in order: each raylet with what runs under it, then the head's other daemons, then the
    GCS. All at once, the raylets and the GCS wait on each other until the kill (measured: 2 s a phase in order, 11 s
    at once, for 2 nodes)."""
    nodes = {q.pid for p in procs if name_of(p) == "raylet" for q in [p, *descendants(p)]}
    gcs = [p for p in procs if name_of(p) == "gcs_server"]
    for phase in ([p for p in procs if p.pid in nodes], [p for p in procs if p.pid not in nodes and p not in gcs], gcs):
        end_processes(phase, grace)
