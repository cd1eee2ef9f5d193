"""Ray ``worker_process_setup_hook`` of local-engine jobs.

It runs first in every worker process of the job, so it imports nothing heavy: defect 14's fix (Levanter's preemption
probe asks the GCE metadata server) is applied when Levanter first imports the probe's module.
"""

from __future__ import annotations


def prepare_worker() -> None:
    from levanter_mars.compat.levanter_infra import preemption_probe_off_gce_when_imported

    preemption_probe_off_gce_when_imported()
