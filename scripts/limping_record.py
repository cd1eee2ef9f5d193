"""The record behind docs/pods.md's figures of a run that limps: ``docs/benchmarks/limping_tiny.json``.

``python scripts/limping_record.py [--output PATH] [--workdir DIR]`` runs bench/limping.py's scenario on this
machine: the tiny config on a local pod of 2 slices x 1 host x 2 devices launched with ``--num_slices 2,1``, slice 1
preempted after step 12, restored once the run has trained 5 steps on one slice; then a plain 1-slice run resumed
from the same checkpoint as the reference of the steps trained on one slice. It records each attempt (slice count,
why it changed, steps, exit, seconds by category, lost seconds), the run's goodput and the worst loss difference
against the reference (about 5 minutes on 2 cores). tests/test_infra_local_limping.py holds the same properties.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "config" / "gpt2_tiny_mars.yaml"
STEPS = 400  # long enough to be training on one slice when the slice is back and seen


def _attempt(entry: dict) -> dict:
    keep = ("slices", "slice_change", "first_step", "last_step", "exit_code", "reason")
    return {**{k: entry.get(k) for k in keep}, "seconds": {k: round(v, 1) for k, v in entry["seconds"].items()}}


def main(argv=None) -> int:
    from levanter_mars.bench.limping import limp, one_slice_reference
    from levanter_mars.bench.report import record_arguments, record_header

    args = record_arguments(__doc__, str(REPO / "docs" / "benchmarks" / "limping_tiny.json"), argv)

    with tempfile.TemporaryDirectory(prefix="limping-") as scratch:
        workdir = Path(args.workdir or scratch)
        run = limp(workdir, TINY, steps=STEPS, repo=REPO)
        if run.returncode != 0:
            raise SystemExit(f"the launch failed ({run.returncode}):\n{run.log[-6000:]}")
        goodput = run.goodput()
        attempts = goodput["attempts"]
        shrunk = next(a for a in attempts if a["slices"] == 1)
        resumed_from, last = shrunk["first_step"] - 1, shrunk["last_step"]
        reference = one_slice_reference(run, resumed_from, last)
        limped = {step: loss for step, loss in run.losses() if resumed_from < step <= last}
        worst = max(abs(limped[s] - reference[s]) for s in reference)
        record = {
            **record_header("the tiny config on 2 slices x 1 host x 2 devices (--num_slices 2,1): slice 1 preempted "
                            "after step 12, restored after 5 steps on one slice",
                            ("jax", "jaxlib", "libtpu", "levanter", "haliax", "ray")),
            "steps": STEPS,
            "every_step_once": [s for s, _ in run.losses()] == list(range(STEPS)),
            "attempts": [_attempt(a) for a in attempts],
            "slice_counts": [a["slices"] for a in attempts],
            "goodput": goodput["goodput"],
            "productive_seconds": round(goodput["productive_seconds"], 1),
            "wall_seconds": round(goodput["wall_seconds"], 1),
            "lost_seconds": round(sum(a["seconds"].get("lost", 0.0) for a in attempts), 1),
            "one_slice_steps": [resumed_from + 1, last],
            "one_slice_vs_reference_worst_loss_difference": worst,
            "one_slice_vs_reference_worst_loss_difference_1e-6": round(worst * 1e6, 3),
        }  # fmt: skip
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in record if k not in ("command", "versions", "machine")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
