"""Ray ``worker_process_setup_hook`` of local-engine jobs.

It runs first in every worker process of the job, so it imports nothing heavy: upstream defect 14's fix (Levanter's
preemption probe asks the GCE metadata server) is applied when Levanter first imports the probe's module, which
only the scheduling workers do.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

PROBE_MODULE = "levanter.infra.tpus"


def _apply() -> None:
    from levanter_mars.training import upstream

    upstream.preemption_probe_off_gce()


class _ApplyAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != PROBE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _apply()

        spec.loader.exec_module = exec_module
        return spec


def prepare_worker() -> None:
    if PROBE_MODULE in sys.modules:
        _apply()
    elif not any(isinstance(f, _ApplyAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ApplyAfterImport())
