"""The record behind docs/pods.md's multi-slice figures: ``docs/benchmarks/multislice_tiny.json``.

``python scripts/multislice_record.py [--output PATH] [--workdir DIR]`` trains the tiny config twice on this machine,
as 1 slice x 1 process x 4 devices and as 2 slices x 1 host x 2 devices (two processes joined by jax.distributed, each
with the ``MEGASCALE_*`` variables a launcher sets), both with ``trainer.replica_dcn_axis_size: -1``, and compares
their losses step by step; it reads which devices every collective of the 2-slice training step joins (XLA:CPU's HLO,
dumped by process 0). Then the TPU compiler compiles the same step for 2 x v5litepod-4, and the record keeps its
slice programs' collectives and the MegaScale transfers that cross slices. tests/test_multislice.py holds the same
properties in CI; this script only records the figures (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU compiler is driven from a CPU-only process

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "config" / "gpt2_tiny_mars.yaml"
DCN_REPLICAS = ["--trainer.replica_dcn_axis_size", "-1"]
TPU_TYPE, TPU_SLICES = "v5litepod-4", 2


def _train(workdir: Path, run_id: str, processes: int, devices: int, dump: Path | None = None) -> dict[int, float]:
    """Trains the tiny config as ``processes`` processes of ``devices`` devices (one slice per process when more
    than one); returns the training loss of each step."""
    from levanter_mars.infra.ports import reserve_ports

    common = [sys.executable, "-m", "levanter_mars.main.train_lm", "--config_path", str(TINY), "--trainer.id", run_id,
              "--trainer.log_dir", str(workdir / "runs"), "--trainer.checkpointer.base_path", str(workdir / "ckpt"),
              *DCN_REPLICAS]  # fmt: skip
    with reserve_ports(1) as lease:
        procs = []
        for i in range(processes):
            flags = f"--xla_force_host_platform_device_count={devices}"
            if dump is not None and i == 0:
                flags += f" --xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*"
            env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
            argv = list(common)
            if processes > 1:
                env.update(MEGASCALE_NUM_SLICES=str(processes), MEGASCALE_SLICE_ID=str(i))
                argv += ["--trainer.distributed.coordinator_address", f"127.0.0.1:{lease.port}",
                         "--trainer.distributed.num_processes", str(processes),
                         "--trainer.distributed.process_id", str(i)]  # fmt: skip
            log = open(workdir / f"{run_id}.process-{i}.log", "w")
            procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"{run_id}: exits {codes}; logs in {workdir}")
    rows = [json.loads(line) for line in (workdir / "runs" / run_id / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _cpu_figures(workdir: Path) -> dict:
    from levanter_mars.bench.collectives import collectives, crossing, only_over_dcn

    one = _train(workdir, "one-slice", processes=1, devices=4)
    dump = workdir / "hlo"
    two = _train(workdir, "two-slices", processes=2, devices=2, dump=dump)
    assert one.keys() == two.keys(), (sorted(one), sorted(two))
    (hlo,) = dump.glob("*train_step*after_optimizations.txt")
    found = collectives(hlo.read_text())
    slice_of = [0, 0, 1, 1]  # the mesh's devices in order: slice 0's, then slice 1's
    across = crossing(found, slice_of)
    dcn = [c for c in across if only_over_dcn(c, slice_of)]
    return {
        "config": str(TINY.relative_to(REPO)), "overrides": DCN_REPLICAS, "steps": len(one),
        "one_slice": "1 process x 4 devices", "two_slices": "2 slices x 1 host x 2 devices (gloo between them)",
        "worst_loss_difference": (worst := max(abs(one[s] - two[s]) for s in one)),
        "worst_loss_difference_1e-6": round(worst * 1e6, 3),  # as docs/pods.md prints it
        "collectives": len(found),
        "crossing_slices": [{"op": c.op, "groups": c.groups, "bytes": c.bytes,
                             "over": "DCN alone" if c in dcn else "every device (the whole batch)"} for c in across],
        "crossing_bytes": {"dcn_alone": sum(c.bytes for c in dcn),
                           "whole_batch": sum(c.bytes for c in across if c not in dcn)},
    }  # fmt: skip


def _tpu_figures(workdir: Path) -> dict:
    from levanter_mars.bench.collectives import collectives, dcn_transfers
    from levanter_mars.infra.preflight.step import lower_train_step
    from levanter_mars.infra.preflight.topology import abstract_devices, tpu_target
    from levanter_mars.infra.slices import slice_type
    from levanter_mars.program_config import parse_train_config

    config = parse_train_config(["--config_path", str(TINY), "--trainer.id", "tpu-slices", "--trainer.log_dir",
                                 str(workdir / "runs"), "--trainer.checkpointer.base_path",
                                 str(workdir / "ckpt"), *DCN_REPLICAS])  # fmt: skip
    devices = abstract_devices(tpu_target(slice_type(TPU_TYPE)), num_slices=TPU_SLICES)
    step = lower_train_step(config, devices, TPU_SLICES, vocab_size=4096, eos_id=None)
    text = step.lowered.compile().as_text()
    ici, dcn = collectives(text), dcn_transfers(text)
    return {
        "tpu_type": TPU_TYPE, "num_slices": TPU_SLICES, "mesh": dict(step.mesh.shape),
        "ici_collectives": len(ici), "ici_groups": sorted({g for c in ici for g in c.groups}),
        "dcn_transfers": [{"kind": t.kind, "bytes": t.bytes, "reduction": t.reduction} for t in dcn],
        "dcn_all_reduces": sum(t.kind == "ALL_REDUCE" for t in dcn),
        "dcn_all_gathers": sum(t.kind == "ALL_GATHER" for t in dcn),
        "dcn_bytes": sum(t.bytes for t in dcn), "largest_dcn_bytes": max(t.bytes for t in dcn),
    }  # fmt: skip


def main(argv=None) -> int:
    from levanter_mars import versions
    from levanter_mars.bench.report import record_arguments, record_header

    args = record_arguments(__doc__, str(REPO / "docs" / "benchmarks" / "multislice_tiny.json"), argv)

    with tempfile.TemporaryDirectory(prefix="multislice-") as scratch:
        workdir = Path(args.workdir or scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        record = {
            **record_header("multi-slice training of the tiny config: 2 slices against 1 on XLA:CPU, and the step "
                            f"for {TPU_SLICES} x {TPU_TYPE} on the TPU compiler",
                            ("jax", "jaxlib", "libtpu", "levanter", "haliax")),
            "compiler": {"jax": versions.installed("jax"), "libtpu": versions.installed("libtpu")},
            "tpu_targets": [TPU_TYPE],
            "cpu": _cpu_figures(workdir),
            "tpu": _tpu_figures(workdir),
        }  # fmt: skip
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("cpu", "tpu")}, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
