"""The XLA flags of every test process: XLA:CPU programs compiled with LLVM's cheap pipeline.

XLA:CPU spends most of a tiny run's compilation in LLVM. At ``--xla_backend_optimization_level=0`` with LLVM's
expensive passes off, a cold tiny training run compiled in 7.2-9.0 s instead of 12.0-16.4 s and took 24-29 CPU-s
instead of 31-41 (alternating, idle machine). What tests hold stays as it was: the HLO (the same passes run), and the
TPU compiler's figures (a one-layer GPT-2 small pre-flight on v4-8: every figure of its JSON equal with and without
these flags, its timings aside). Float rounding is not bitwise the same as at the default level (7 of a tiny run's 34 logged losses
differ in their last bit), which no test depends on: every comparison is within one session, or within a tolerance.
Users' programs are compiled at XLA's defaults; so are the benchmarks' timed runs outside the test suite, and
scripts/cpu_pod_eval_hang.py's pods (it builds them with tests/helpers/pod.py, at the defaults it measured with).
``LEVANTER_MARS_TEST_XLA_DEFAULTS=1`` runs the tests at XLA's defaults too.
"""

from __future__ import annotations

import os

CHEAP_CPU_CODEGEN = (
    () if os.environ.get("LEVANTER_MARS_TEST_XLA_DEFAULTS", "") not in ("", "0")
    else ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
)


def with_cheap_codegen(flags: str) -> str:
    """``flags`` with the test suite's codegen flags in front (once)."""
    kept = [flag for flag in flags.split() if flag not in CHEAP_CPU_CODEGEN]
    return " ".join([*CHEAP_CPU_CODEGEN, *kept])


def device_flags(devices: int) -> str:
    """XLA_FLAGS for a test process with ``devices`` simulated CPU devices."""
    return with_cheap_codegen(f"--xla_force_host_platform_device_count={devices}")


def set_for_this_process() -> None:
    """Before jax starts a backend: this process and every child that inherits its environment."""
    os.environ["XLA_FLAGS"] = with_cheap_codegen(os.environ.get("XLA_FLAGS", ""))
