"""Pre-flight's verdict: per-chip memory of the compiled train step against the chip's HBM, and what to change."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from levanter.infra.ray_tpu import TPU_CONFIGS

from levanter_mars.infra.preflight.step import Compiled
from levanter_mars.infra.preflight.topology import GiB, TpuTarget


def next_larger_slice(tpu_type: str) -> Optional[str]:
    generation = tpu_type.split("-")[0]
    current = next(c.chip_count for c in TPU_CONFIGS if c.name == tpu_type)
    larger = sorted((c.chip_count, c.name) for c in TPU_CONFIGS if c.name.startswith(generation + "-"))
    return next((name for chips, name in larger if chips > current), None)


@dataclass(frozen=True)
class Verdict:
    config_path: str
    target: TpuTarget
    num_slices: int
    parameters: int
    optimizer_state: int
    compiled: Compiled
    per_device_parallelism: int
    train_batch_size: int
    data_axis_size: int
    gradient_checkpointing: Any
    eval_steps: dict
    model_flops_per_step: Optional[float] = None
    """Whole step, all chips: 3 x the model's forward flops per token x tokens, the figure training logs for MFU.
    (The compiler's cost analysis counts a scanned layer stack's loop body once, so it is reported apart.)"""
    """Name -> Compiled, for the in-training eval programs (each runs on its own, so each must fit alone)."""

    @property
    def hbm(self) -> int:
        return self.target.hbm_bytes_per_chip

    @property
    def programs(self) -> dict:
        return {"train_step": self.compiled, **self.eval_steps}

    @property
    def fits(self) -> bool:
        return all(c.out_of_memory is None and c.total_bytes <= self.hbm for c in self.programs.values())

    def to_json(self) -> dict:
        c = self.compiled
        return {
            "config": self.config_path,
            "tpu_type": self.target.tpu_type,
            "topology": self.target.topology,
            "num_slices": self.num_slices,
            "chips": self.target.chips * self.num_slices,
            "hbm_bytes_per_chip": self.hbm,
            "per_chip": {
                "parameters": self.parameters,
                "optimizer_state": self.optimizer_state,
                "arguments": c.argument_bytes,
                "temporaries": c.temp_bytes,
                "total": c.total_bytes,
            },
            "headroom_bytes": self.hbm - c.total_bytes,
            "fits": self.fits,
            "flops_per_step": self.model_flops_per_step,
            "compiler_flops_per_chip": c.flops,
            "compile_seconds": round(c.compile_seconds, 1),
            "per_device_parallelism": self.per_device_parallelism,
            "train_batch_size": self.train_batch_size,
            "data_axis_size": self.data_axis_size,
            "out_of_memory": c.out_of_memory,
            "compiler_hbm_bytes": c.capacity_bytes,
            "eval": {name: {"total": e.total_bytes, "fits": e.out_of_memory is None and e.total_bytes <= self.hbm,
                            "compile_seconds": round(e.compile_seconds, 1)} for name, e in self.eval_steps.items()},
        }

    def table(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GiB:8.2f} GiB"

        c = self.compiled
        t = self.target
        lines = [
            f"pre-flight: {self.config_path} on {self.num_slices} x {t.tpu_type} (topology {t.topology}, "
            f"{t.chips} chips, {t.devices} JAX devices per slice, TPU compiler)",
            f"  per chip        parameters {gib(self.parameters)}",
            f"                  optimizer  {gib(self.optimizer_state)}",
        ]
        if c.out_of_memory is None:
            lines.append(f"                  temporary  {gib(c.temp_bytes)}")
        lines += [
            f"                  total      {gib(c.total_bytes)}   of {gib(self.hbm)} HBM, headroom "
            f"{(self.hbm - c.total_bytes) / GiB:.2f} GiB",
            f"  flops per step  {self.model_flops_per_step or float('nan'):.3e} (model, all chips; compiler's "
            f"figure per chip: {c.flops or float('nan'):.3e}, loop bodies counted once)",
            f"  compile         {c.compile_seconds:.0f} s",
        ]
        for name, e in self.eval_steps.items():
            lines.append(f"  {name:<15} total {gib(e.total_bytes)} (compile {e.compile_seconds:.0f} s)")
        lines.append("  verdict         " + ("fits" if self.fits else "DOES NOT FIT"))
        return "\n".join(lines)

    def refusal(self) -> str:
        """One line naming what to change."""
        worst_name, worst = max(self.programs.items(), key=lambda kv: kv[1].total_bytes)
        larger = next_larger_slice(self.target.tpu_type)
        what = "" if worst_name == "train_step" else f" ({worst_name})"
        return (
            f"{self.config_path} does not fit on {self.target.tpu_type}{what}: it needs "
            f"{worst.total_bytes / GiB:.2f} GiB per chip of {self.hbm / GiB:.0f} GiB HBM. Lower "
            f"trainer.per_device_parallelism (now {self.per_device_parallelism}; microbatching keeps "
            f"train_batch_size), set model.gradient_checkpointing (now {self.gradient_checkpointing}), or use a "
            f"larger --tpu_type{f' ({larger})' if larger else ''}"
        )


def json_line(payload: dict) -> str:
    return json.dumps(payload, sort_keys=False)
