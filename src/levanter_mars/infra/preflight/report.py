"""Pre-flight's verdict: per-chip memory of the compiled train step against the chip's HBM, and what to change."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from levanter_mars.infra.preflight.eval_steps import EVAL_HARNESS
from levanter_mars.infra.preflight.capacity import UsableHbm
from levanter_mars.infra.preflight.step import ONE_BUFFER, Compiled
from levanter_mars.infra.preflight.topology import GiB, TpuTarget
from levanter_mars.infra.slices import neighbour_slice
from levanter_mars.versions import command_line, compiler_versions


TRAIN_STEP = "train_step"


@dataclass(frozen=True)
class Verdict:
    config_path: str
    target: TpuTarget
    num_slices: int
    parameters: int
    optimizer_state: int
    compiled: Compiled
    usable: UsableHbm
    """The HBM per chip the compiler lets a program use (``capacity.py``): every program is judged against it."""
    per_device_parallelism: int
    train_batch_size: int
    data_axis_size: int
    gradient_checkpointing: Any
    eval_steps: dict
    """Name -> Compiled, for the in-training eval programs. Each runs between train steps, while the train state is
    resident: its peak is its own program's plus the optimizer state (its arguments already hold the model)."""
    per_device_eval_parallelism: int = 0
    eval_batch_size: int = 0
    eval_skipped: Optional[str] = None
    """Why the eval programs were not compiled (the train step alone already decides the verdict)."""
    model_flops_per_step: Optional[float] = None
    """Whole step, all chips: 3 x the model's forward flops per token x tokens, the figure training logs for MFU.
    (The compiler's cost analysis counts a scanned layer stack's loop body once, so it is reported apart.)"""
    seconds: Optional[dict] = None
    """Wall time of each phase of this pre-flight (build, lower, compile, eval)."""

    @property
    def hbm(self) -> int:
        """The chip's nominal HBM (Google's figure)."""
        return self.target.hbm_bytes_per_chip

    @property
    def programs(self) -> dict:
        return {TRAIN_STEP: self.compiled, **self.eval_steps}

    def peak(self, name: str) -> Optional[int]:
        """Per chip while the program runs: the train step's own total; an eval program's plus the resident
        optimizer state. ``None`` where the compiler refused the program and stated only a part of it."""
        own = self.programs[name].total_bytes
        if own is None or name == TRAIN_STEP:
            return own
        return own + self.optimizer_state

    def program_fits(self, name: str) -> bool:
        return self.programs[name].out_of_memory is None and self.peak(name) <= self.usable.bytes

    @property
    def fits(self) -> bool:
        return all(self.program_fits(name) for name in self.programs)

    @property
    def headroom(self) -> Optional[int]:
        """Usable HBM less the train step's total (``None`` without a total)."""
        total = self.compiled.total_bytes
        return None if total is None else self.usable.bytes - total

    def _eval_json(self) -> dict:
        out = {}
        for name, e in self.eval_steps.items():
            out[name] = {
                "per_device_eval_parallelism": self.per_device_eval_parallelism,
                "eval_batch_size": self.eval_batch_size,
                "temporaries": e.temp_bytes, "program_total": e.total_bytes,
                "resident_optimizer_state": self.optimizer_state, "total": self.peak(name),
                **({"partial": e.partial} if e.partial else {}),
                "fits": self.program_fits(name), "compile_seconds": round(e.compile_seconds, 1),
                "out_of_memory": e.out_of_memory,
            }
        if self.eval_skipped:
            out["skipped"] = self.eval_skipped
        return out

    def to_json(self) -> dict:
        c = self.compiled
        return {
            "config": self.config_path,
            "tpu_type": self.target.tpu_type,
            "topology": self.target.topology,
            "num_slices": self.num_slices,
            "chips": self.target.chips * self.num_slices,
            "hbm_bytes_per_chip": self.hbm,
            "usable_hbm_bytes_per_chip": self.usable.bytes,
            "usable_hbm_source": self.usable.source,
            "per_chip": {
                "parameters": self.parameters,
                "optimizer_state": self.optimizer_state,
                "arguments": c.argument_bytes,
                "temporaries": c.temp_bytes,
                "total": c.total_bytes,
                **({"partial": c.partial} if c.partial else {}),
            },
            "headroom_bytes": self.headroom,
            "fits": self.fits,
            "flops_per_step": self.model_flops_per_step,
            "compiler_flops_per_chip": c.flops,
            "compile_seconds": round(c.compile_seconds, 1),
            "load_average": c.load_average,
            "per_device_parallelism": self.per_device_parallelism,
            "train_batch_size": self.train_batch_size,
            "data_axis_size": self.data_axis_size,
            "out_of_memory": c.out_of_memory,
            "eval": self._eval_json(),
            "seconds": self.seconds,
            "compiler": compiler_versions(),
            "command": command_line(),
        }

    def _needs(self, name: str) -> str:
        """What the program needs per chip, as the compiler counted it."""
        program = self.programs[name]
        if program.partial:
            part = program.partial
            verb = "needs" if part["counts"] == ONE_BUFFER else "need"
            return f"{part['counts']} {verb} {part['bytes'] / GiB:.2f} GiB (the compiler's figure)"
        with_state = "" if name == TRAIN_STEP else " with the resident optimizer state"
        return f"it needs {self.peak(name) / GiB:.2f} GiB{with_state}"

    def table(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GiB:8.2f} GiB"

        c = self.compiled
        t = self.target
        of = f"of {self.usable.bytes / GiB:.2f} GiB usable ({self.hbm / GiB:.0f} GiB HBM)"
        lines = [
            f"pre-flight: {self.config_path} on {self.num_slices} x {t.tpu_type} (topology {t.topology}, "
            f"{t.chips} chips, {t.devices} JAX devices per slice, TPU compiler)",
            f"  per chip        parameters {gib(self.parameters)}",
            f"                  optimizer  {gib(self.optimizer_state)}",
        ]
        if c.out_of_memory is None:
            lines.append(f"                  temporary  {gib(c.temp_bytes)}")
        if c.total_bytes is None:
            lines.append(f"                  refused    {self._needs(TRAIN_STEP)}, {of}")
        else:
            lines.append(f"                  total      {gib(c.total_bytes)}   {of}, headroom "
                         f"{self.headroom / GiB:.2f} GiB")
        lines += [
            f"  flops per step  {self.model_flops_per_step or float('nan'):.3e} (model, all chips; compiler's "
            f"figure per chip: {c.flops or float('nan'):.3e}, loop bodies counted once)",
            f"  compile         {c.compile_seconds:.0f} s",
        ]
        for name, e in self.eval_steps.items():
            temporaries = f"temporary {gib(e.temp_bytes)}, " if e.out_of_memory is None else ""
            lines.append(
                f"  {name:<15} {temporaries}{self._needs(name)} ({self.per_device_eval_parallelism} sequences per "
                f"chip, compile {e.compile_seconds:.0f} s): " + ("fits" if self.program_fits(name) else "DOES NOT FIT")
            )
        if self.eval_skipped:
            lines.append(f"  eval programs   not compiled: {self.eval_skipped}")
        lines.append("  verdict         " + ("fits" if self.fits else "DOES NOT FIT"))
        return "\n".join(lines)

    def refusal(self) -> str:
        """One line naming every program that does not fit, with its own figure (figures that count different
        things are not ranked against each other), and what to change."""
        failing = [name for name in self.programs if not self.program_fits(name)]
        larger = neighbour_slice(self.target.tpu_type, larger=True)
        said = "; ".join(
            self._needs(name) if name == TRAIN_STEP else f"{name} (between train steps): {self._needs(name)}"
            for name in failing
        )
        needs = (f"{self.config_path} does not fit on {self.target.tpu_type}: {said} per chip, of "
                 f"{self.usable.bytes / GiB:.2f} GiB usable ({self.hbm / GiB:.0f} GiB HBM). ")
        slice_hint = f"use a larger --tpu_type{f' ({larger})' if larger else ''}"
        if TRAIN_STEP in failing:
            return needs + (
                f"Lower trainer.per_device_parallelism (now {self.per_device_parallelism}; microbatching keeps "
                f"train_batch_size), set model.gradient_checkpointing (now {self.gradient_checkpointing}), or "
                + slice_hint
            )
        harness = " or eval_harness.max_length" if EVAL_HARNESS in failing else ""
        return needs + (
            f"Lower trainer.per_device_eval_parallelism (now {self.per_device_eval_parallelism}; the eval batch is "
            f"not microbatched){harness}, or {slice_hint}"
        )


def json_line(payload: dict) -> str:
    return json.dumps(payload, sort_keys=False)
