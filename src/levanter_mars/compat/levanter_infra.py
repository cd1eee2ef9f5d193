"""Defects 14 and 45 of Levanter's TPU infrastructure.

Defect 14: Levanter's TPU preemption probe asks the GCE metadata server, without a timeout.

``run_on_pod`` checks every slice every 10 s and sorts failures with it; off GCP it raises, so every attempt is torn
down as unhealthy. Local-engine Ray workers answer "not preempted" without the network. This module imports nothing
heavy: it runs first in every worker process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

PROBE_MODULE = "levanter.infra.tpus"


def _not_preempted() -> bool:
    return False


def preemption_probe_off_gce() -> None:
    """Replaces Levanter's GCE preemption probe in this process."""
    # Through sys.modules: this may run while the module is still being imported.
    tpus = importlib.import_module(PROBE_MODULE)
    tpus.get_current_tpu_is_preempted = _not_preempted


class _ApplyAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != PROBE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            preemption_probe_off_gce()

        spec.loader.exec_module = exec_module
        return spec


def preemption_probe_off_gce_when_imported() -> None:
    """Applies the fix now if Levanter's probe module is loaded, else as soon as it is (only scheduling workers
    import it)."""
    if PROBE_MODULE in sys.modules:
        preemption_probe_off_gce()
    elif not any(isinstance(f, _ApplyAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ApplyAfterImport())


# Defect 45: Levanter's run_on_pod limps badly. Given a list of slice counts it first waits for the largest count's
# slices for up to _START_ACTOR_TIMEOUT (a week) before it settles for fewer; its scale-up check waits as long for
# slices that are not there; it scales up no sooner than a fixed 12 hours, and then by killing the run between
# checkpoints. A preemption past its budget is told apart from a failure only by its message, and a slice lost with
# its hosts ends the attempt as a *failure*: the lost host actor owned its task's result, whose read raises
# OwnerDiedError, which its error sorting does not know (an "Unknown error", a TpuRunError). The launcher
# (infra/pod.py) runs each attempt on one count it chose by what is up now, through :func:`run_on_slices`.
PREEMPTED_MESSAGE = "TPU job was preempted too many times"


class SlicesPreempted(RuntimeError):
    """A slice of the attempt was preempted (or a host lost): Levanter's run_on_pod gave up on it. ``exits``: what
    the launcher knows of the hosts' ends (the hosts that reported, then the lost), if anything."""

    def __init__(self, message: str, exits=None):
        super().__init__(message)
        self.exits = list(exits) if exits else None


def run_on_slices(remote_fn, tpu_type: str, slices: int) -> list:
    """One attempt on ``slices`` slices: every host's result, or :class:`SlicesPreempted`. Levanter retries
    nothing itself (``max_retries_*=0``); the launcher's outcome policy does."""
    from levanter.infra.ray_tpu import run_on_pod

    from ray.exceptions import OwnerDiedError

    try:
        return run_on_pod(remote_fn, tpu_type, num_slices=slices, max_retries_preemption=0, max_retries_failure=0)
    except Exception as e:  # a RayTaskError that is also its cause's class
        if isinstance(e, OwnerDiedError) or PREEMPTED_MESSAGE in str(e):
            raise SlicesPreempted((str(e).strip().splitlines() or [type(e).__name__])[-1]) from e
        raise
