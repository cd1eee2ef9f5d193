"""Defect 14: Levanter's TPU preemption probe asks the GCE metadata server, without a timeout.

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
