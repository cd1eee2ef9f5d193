"""Defect 48 (``levanter_mars.compat.jax_tpu_probe``): jax loads libtpu to look for a TPU on a machine without one, and
libtpu says so on stderr; the package, imported first by every command, chooses the CPU there."""

import os
import subprocess
import sys

import pytest

from levanter_mars.compat.jax_tpu_probe import platforms_without_a_tpu
from tests.helpers.processes import REPO

LIBTPU_NOISE = ("Failed to find host bounds", "unexpected worker hostname")
_DEVICES = "import jax; print('devices', [d.platform for d in jax.devices()])"


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell has it
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "true"  # another process's libtpu may hold its lock file: it would fail quietly
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two interpreters, one of which loads libtpu
def test_defect_48_jax_loads_libtpu_on_a_machine_without_a_tpu_and_the_package_keeps_it_quiet():
    if platforms_without_a_tpu({}) is None:
        pytest.skip("this machine has an accelerator, or no libtpu: jax's probe is not the defect here")
    raw = _python(_DEVICES)
    assert raw.returncode == 0 and "devices ['cpu']" in raw.stdout, raw.stderr[-3000:]
    assert all(line in raw.stderr for line in LIBTPU_NOISE), raw.stderr[-3000:]  # the defect: fails once jax is fixed
    ours = _python(f"import levanter_mars, os; print('platforms', os.environ['JAX_PLATFORMS']); {_DEVICES}")
    assert ours.returncode == 0 and "devices ['cpu']" in ours.stdout, ours.stderr[-3000:]
    assert "platforms cpu" in ours.stdout
    assert not [line for line in LIBTPU_NOISE if line in ours.stderr], ours.stderr[-3000:]


def test_the_cpu_is_chosen_only_where_there_is_no_accelerator_and_no_choice_was_made(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name == "libtpu" else None)
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "null").write_text("")
    assert platforms_without_a_tpu({}, str(dev)) == "cpu"
    assert platforms_without_a_tpu({"JAX_PLATFORMS": ""}, str(dev)) is None  # a choice, even jax's default
    for device in ("accel0", "vfio/0", "nvidia0", "kfd"):  # a TPU VM (v4; v5e and later), an NVIDIA or AMD GPU
        (dev / device).parent.mkdir(exist_ok=True)
        (dev / device).write_text("")
        assert platforms_without_a_tpu({}, str(dev)) is None, device
        (dev / device).unlink()
    (dev / "vfio" / "vfio").write_text("")  # the VFIO control node every Linux may have: no TPU
    assert platforms_without_a_tpu({}, str(dev)) == "cpu"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert platforms_without_a_tpu({}, str(dev)) is None  # no libtpu: nothing would be loaded
