"""Pre-flight's output holds its verdict, not libtpu's startup noise (issue 46): libtpu, loading on a machine that is
no TPU VM, writes `Failed to find host bounds` and `E0000 ... unexpected worker hostname` to the process's stderr."""

import os
import subprocess
import sys

import pytest

from levanter_mars.infra.preflight.topology import libtpu_startup_noise_held
from tests.helpers.preflight import REPO

LIBTPU_NOISE = ("Failed to find host bounds", "unexpected worker hostname")

_RAW = """
from jax.experimental import topologies
print("devices", len(topologies.get_topology_desc(platform="tpu", topology_name="v4:2x2x1",
                                                  chip_config_name="megacore").devices))
"""
_OURS = """
from levanter_mars.infra.preflight.topology import abstract_devices, tpu_target
from levanter_mars.infra.slices import slice_type
print("devices", len(abstract_devices(tpu_target(slice_type("v4-8")))))
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_held_output_is_dropped_when_the_block_succeeds_and_shown_when_it_fails(capfd):
    with libtpu_startup_noise_held():
        os.write(2, b"E0000 noise of a load that worked\n")
    print("after", file=sys.stderr)
    assert capfd.readouterr().err == "after\n"
    with pytest.raises(RuntimeError, match="no topology"), libtpu_startup_noise_held():
        os.write(2, b"E0000 the reason it failed\n")
        raise RuntimeError("no topology")
    assert "E0000 the reason it failed" in capfd.readouterr().err


@pytest.mark.slow  # two interpreters load libtpu
def test_libtpu_says_it_found_no_tpu_vm_and_pre_flights_topology_does_not_show_it():
    raw = _run(_RAW)
    assert raw.returncode == 0 and "devices 4" in raw.stdout, raw.stderr[-3000:]
    assert all(line in raw.stderr for line in LIBTPU_NOISE), raw.stderr[-3000:]  # what the hold is for
    ours = _run(_OURS)
    assert ours.returncode == 0 and "devices 4" in ours.stdout, ours.stderr[-3000:]
    assert not [line for line in LIBTPU_NOISE if line in ours.stderr], ours.stderr[-3000:]
