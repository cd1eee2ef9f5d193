"""levanter-mars: the MARS optimizer (arXiv 2411.10438) on Levanter."""

from levanter_mars.compat.jax_tpu_probe import no_tpu_probe_without_a_tpu

# Before jax is imported by any command of the package: no libtpu probe on a machine without a TPU (compat defect 48).
no_tpu_probe_without_a_tpu()
