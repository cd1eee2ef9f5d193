"""Pre-flight: the train step compiled by the TPU compiler for a slice, on this machine, before a pod is rented.

``topology`` (slice name -> the compiler's topology, chips, HBM), ``step`` (the trainer's own step on the slice's
abstract devices, compiled), ``report`` (the verdict and what to change), ``launch_check`` (the launcher's call).
The entry point is ``levanter_mars.main.preflight``; docs/pods.md has the tables.
"""
