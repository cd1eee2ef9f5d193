"""A preemption notice to ONE host of a local pod (2 processes x 2 simulated devices, jax.distributed over gloo):
jax's preemption service carries it to every host, they agree on a step (reached_preemption_sync_point), all save that
step and exit 9 together; the rerun resumes at the next step with 0 steps redone and losses bitwise the uninterrupted
pod's. (One process, in CI: tests/test_preemption.py.)"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.errors import ExitCode
from levanter_mars.training.run.goodput.record import GOODPUT_FILENAME
from tests.helpers.pod import HUNG_AFTER_SILENCE_S, run_pod, start_pod
from tests.helpers.seeds import seeded_random
from tests.helpers.training import POLL_S, last_step, losses, output, run_paths, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.multidevice, pytest.mark.extended]


def test_sigterm_to_one_host_saves_the_same_step_on_every_host(tmp_path, pydocs_corpus, pod_reference):
    run_id = "pod-preempted"
    config = tiny_config(tmp_path, pydocs_corpus, run_id)
    paths = run_paths(tmp_path, run_id)
    # Between the periodic checkpoints (10, 20), seen in the metrics as a cloud's notice comes: at any moment.
    notice_after = seeded_random(run_id).randint(11, 16)
    pod = start_pod(config, log_dir=tmp_path / "logs", name=run_id)
    deadline = time.time() + 600
    while not (paths["metrics"].exists() and last_step(paths["metrics"]) >= notice_after):
        assert all(p.poll() is None for p in pod.procs) and time.time() < deadline, pod.describe()
        time.sleep(POLL_S)
    pod.procs[1].send_signal(signal.SIGTERM)
    codes = pod.wait(600, silent_s=HUNG_AFTER_SILENCE_S)
    assert codes == [ExitCode.PREEMPTED] * 2, pod.describe()
    saved = {int(m) for i in range(2) for m in re.findall(r"preempted: saved at step (\d+)", pod.output(i))}
    assert len(saved) == 1, pod.describe()  # the same step on both hosts, each saying so
    (saved,) = saved
    assert notice_after <= saved < 20
    assert (paths["checkpoints"] / f"step-{saved}" / MANIFEST_NAME).exists()
    assert last_step(paths["metrics"]) == saved

    rerun = run_pod(config, log_dir=tmp_path / "logs", name=f"{run_id}-rerun")
    assert [p.returncode for p in rerun.procs] == [0, 0], rerun.describe()
    assert f"step-{saved}" in rerun.output(0) and "Resuming from" in rerun.output(0)
    got, reference = losses(paths["metrics"]), losses(pod_reference[2]["metrics"])
    assert sorted(got) == list(range(30))
    assert got == reference, {s: (got[s], reference[s]) for s in reference if got.get(s) != reference[s]}
    first, second = json.loads((paths["run_dir"] / GOODPUT_FILENAME).read_text())["attempts"]
    assert first["ended_as"] == f"preempted, saved at step {saved}" and first["steps_redone_next"] == 0
    assert second["first_step"] == saved + 1
