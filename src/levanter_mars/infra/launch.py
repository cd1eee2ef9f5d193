"""``python -m levanter_mars.infra.launch --config_path config/X.yaml --tpu_type v4-32 [--num_slices N]
[--retries K] [--preemption_retries P] [--address http://...] [--dry_run] [-- training overrides]``

Submits the run as a Ray job (one training process per TPU host, restarted after preemptions and failures) and
follows its log. ``--tpu_type cpu`` runs it on a local Ray cluster (see ``local_cluster.py``). See infra/README.md.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from levanter_mars.infra.config import LaunchError, RayLaunchConfig
from levanter_mars.infra.plan import prepare_cli
from levanter_mars.infra.ray_job import build_job, follow, how_to_watch, resolve_address, submit


def cli(argv: Optional[Sequence[str]] = None) -> int:
    prepared = prepare_cli(sys.argv[1:] if argv is None else list(argv), RayLaunchConfig)
    if isinstance(prepared, int):
        return prepared
    launch, run = prepared
    job = build_job(run, launch)
    address = resolve_address(launch.address)
    if launch.dry_run:
        print(run.report({"address": address, "ray_job": job.printable()}))
        return 0
    try:
        submission = submit(job, address)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"submitted Ray job {submission} to {address} (run {run.run_id}, {run.slice.name} x {run.job.num_slices})")
    if not launch.follow:
        print(how_to_watch(submission, address))
        return 0
    try:
        status = follow(submission, address)
    except KeyboardInterrupt:
        print(f"\nstopped following; the job goes on:\n{how_to_watch(submission, address)}", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a dropped log stream (tunnel closed, laptop asleep) ends only the watching
        print(f"lost the job's log ({type(e).__name__}: {e}); the job goes on:\n{how_to_watch(submission, address)}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"Ray job {submission}: {status}")
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(cli())
