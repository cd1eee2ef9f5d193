"""The launcher's local engine as a multi-slice pod: one command starts a private Ray cluster whose nodes pose as two
slices, Levanter's run_on_pod schedules one host task per slice with that slice's ``MEGASCALE_*`` variables, and the
two training processes meet at one ``jax.distributed`` coordinator and train with the mesh's DCN axis across the
slices. That 2 slices x 1 host x 2 devices train like 1 slice of 4 devices is held by tests/test_multislice.py
(processes started directly, no Ray): this test does not repeat the comparison. It is ``extended`` (``make
test-all``; 175-181 s on the 2 cores): its ground is covered in CI by that test (the training over the DCN mesh) and
by tests/test_infra_local_pod.py (each piece of the launcher's: the nodes' slices, the process ids, MEGASCALE_* kept,
the dry run)."""

import json
import os
import re
import subprocess

import psutil
import pytest

from tests.helpers.ray_launch import launcher_command, launcher_env
from tests.helpers.training import REPO, output, run_paths, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extended]

MESH_LINE = "Mesh: replica 2 (DCN 2 x ICI 1), data 2 (DCN 1 x ICI 2), model 1; 2 slice(s) of 2 device(s)"


def test_local_engine_trains_two_slices_of_one_host_with_data_parallelism_over_dcn(tmp_path, pydocs_corpus):
    """Each training process checks that its ``MEGASCALE_SLICE_ID`` is the slice its process id puts it in
    (compat/levanter_slices.py), so a run that trains at all was numbered slice-major by the launcher."""
    run_id = "pod-two-slices"
    config = tiny_config(tmp_path, pydocs_corpus, run_id)
    env = launcher_env({}, {})
    env.pop("RAY_ADDRESS", None)
    flags = ("--num_slices", "2", "--num_hosts", "1", "--devices_per_host", "2", "--retries", "0")
    proc = subprocess.run(
        launcher_command(config, *flags, "--", "--trainer.replica_dcn_axis_size", "-1"),
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = output(proc)
    assert proc.returncode == 0, log[-6000:]
    assert "(2 slices x 1 host(s))" in log and "Running on 2 x TPU cpu" in log, log[-6000:]
    # Levanter's scheduler ran one host task on each slice the nodes pose as.
    assert "Futures for slice local-cpu:" in log and "Futures for slice local-cpu-1:" in log, log[-6000:]
    assert "launch done: every host finished (process 0: exit 0 (done), process 1: exit 0 (done))" in log
    paths = run_paths(tmp_path, run_id)
    records = [json.loads(line) for line in paths["metrics"].read_text().splitlines()]
    assert sorted(r["step"] for r in records if "train/loss" in r) == list(range(30)), "every step exactly once"
    run_log = (tmp_path / "runs" / f"{run_id}.log").read_text()
    assert MESH_LINE in run_log, run_log[-3000:]
    assert " - 0 - " in run_log and " - 1 - " in run_log, "both processes of the one jax.distributed job logged"
    # The private cluster is gone with every process it started.
    temp_dir = re.search(r"starting a private Ray cluster .* in (\S+)", log).group(1)
    assert not os.path.exists(temp_dir)
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if any(temp_dir in a for a in p.info["cmdline"] or ())]
