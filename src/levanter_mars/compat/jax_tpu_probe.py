"""Defect 48: on a machine without a TPU, jax still loads libtpu to look for one.

jax's own PCI scan (``cloud_tpu_init``) finds no TPU chip, yet with libtpu installed (the ``tpu`` extra pre-flight
needs) its ``tpu`` backend factory loads libtpu anyway. libtpu then asks for the VM's accelerator type and worker
hostnames, finds none and says so on the process's stderr (``Failed to find host bounds for accelerator type``,
``E0000 ... unexpected worker hostname``), below every command's own output and in every host's log of the local pod,
and it takes ``/tmp/libtpu_lockfile`` while it looks (a pre-flight compiling beside a training process then finds the
lock taken). The backend fails and jax falls back to the CPU: all of it for nothing.

The workaround is one decision, made as the package is imported (``levanter_mars/__init__.py``: every command is a
``python -m levanter_mars...``, imported before jax is): on Linux with libtpu installed, no TPU chip (a TPU VM shows
its chips as ``/dev/accel*`` or ``/dev/vfio/<n>``, which is where libtpu and Ray look), no GPU device, and no
``JAX_PLATFORMS`` chosen, it chooses ``cpu``: the only platform there is. It imports nothing (the Ray host task and
the launcher import this package without jax).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import MutableMapping, Optional

#: Device nodes of accelerators JAX could use: TPU chips (v2-v4: accel; v5e and later: vfio), NVIDIA and AMD GPUs.
TPU_DEVICES = ("accel*", "vfio/[0-9]*")
GPU_DEVICES = ("nvidia[0-9]*", "kfd")


def platforms_without_a_tpu(environ: MutableMapping[str, str] = os.environ, dev: str = "/dev") -> Optional[str]:
    """The ``JAX_PLATFORMS`` to set on this machine, or None to leave jax to choose (see the module docstring)."""
    if "JAX_PLATFORMS" in environ or not sys.platform.startswith("linux"):
        return None
    if importlib.util.find_spec("libtpu") is None:
        return None  # no libtpu: jax has nothing to load
    if any(glob.glob(os.path.join(dev, pattern)) for pattern in (*TPU_DEVICES, *GPU_DEVICES)):
        return None
    return "cpu"


def no_tpu_probe_without_a_tpu(environ: MutableMapping[str, str] = os.environ) -> None:
    chosen = platforms_without_a_tpu(environ)
    if chosen is not None:
        environ["JAX_PLATFORMS"] = chosen
