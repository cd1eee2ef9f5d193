"""Time to quarantine a checkpoint on object storage: the old whole-prefix move against the in-place quarantine.

Runs on the local GCS emulator of the tests (tests/helpers/gcs.py, needs the test extras), with checkpoints of
synthetic chunk objects. The baseline is what ``checkpointing.quarantine.quarantine`` did before: ``fs.mv(prefix, ...,
recursive=True)``, which on GCS copies and deletes every object. Prints seconds and HTTP requests for each object
count, and the ratio baseline / in-place.

    python scripts/bench_gcs_quarantine.py --objects 132 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[132, 1000])
    args = parser.parse_args(argv)

    import os

    import fsspec
    import gcsfs

    from levanter_mars.training.checkpointing.manifest import write_manifest
    from levanter_mars.training.checkpointing.quarantine import quarantine
    from levanter_mars.training.checkpointing.storage import METADATA_NAME
    from tests.helpers.gcs import gcs_emulator

    with gcs_emulator() as gcs:
        os.environ.update(gcs.env)
        fsspec.config.conf["gs"] = {"token": "anon"}
        gcsfs.GCSFileSystem.clear_instance_cache()
        fs = fsspec.filesystem("gs")

        def make(name: str, n: int) -> str:
            root = f"{gcs.bucket}/{name}/run/step-20"
            fs.pipe({f"{root}/model/w/c.{i}": b"\x01" * 64 for i in range(n - 2)})
            metadata = {"step": 20, "timestamp": "2026-01-01T00:00:00"}
            fs.pipe(f"{root}/{METADATA_NAME}", json.dumps(metadata).encode())
            write_manifest(f"gs://{root}", step=20)
            fs.invalidate_cache()
            gcs.requests.clear()
            return root

        def measure(quarantine) -> tuple[float, int]:
            start = time.perf_counter()
            quarantine()
            return time.perf_counter() - start, sum(gcs.requests.values())

        print(f"{'objects':>8} {'move s':>8} {'move req':>9} {'in place s':>11} {'in place req':>13} {'ratio':>7}")
        for n in args.objects:
            old = make(f"move-{n}", n)
            moved = measure(lambda: fs.mv(old, f"{gcs.bucket}/move-{n}/run.quarantine/step-20.x", recursive=True))
            new = make(f"inplace-{n}", n)
            in_place = measure(lambda: quarantine(f"gs://{new}", "benchmark"))
            print(f"{n:>8} {moved[0]:>8.2f} {moved[1]:>9} {in_place[0]:>11.3f} {in_place[1]:>13} "
                  f"{moved[0] / in_place[0]:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
