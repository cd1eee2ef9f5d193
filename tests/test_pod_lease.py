"""One live launch per run, on a pod (issue 46): the same 2-host pod started again while the first still runs is
refused on every host, before either writes anything. (One process: tests/test_reliability.py; the lease's rules:
tests/test_lease.py.) Derived from the session's pod reference up to its step-20 checkpoint."""

import json
import time

import pytest

from tests.helpers.faults import prelude
from tests.helpers.pod import run_pod, start_pod
from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import POLL_S

pytestmark = pytest.mark.slow


def _files(root) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_launch_of_a_live_pod_is_refused_on_every_host_and_writes_nothing(pod_reference, tmp_path):
    config, _pod, paths = pod_reference
    copy, new = copy_of_run(config, paths, tmp_path / "run", up_to_step=20, run_id="pod-leased")
    held = tmp_path / "held"
    logs = tmp_path / "logs"
    live = start_pod(copy, log_dir=logs, name="live", prelude=prelude("install_pause_at_step", step=22,
                                                                       signal_path=str(held)))  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not held.exists() and all(p.poll() is None for p in live.procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert held.exists(), live.describe()
        lease = new["checkpoints"].parent / "pod-leased.lease.json"
        holder = json.loads(lease.read_text())
        checkpoints, metrics = _files(new["checkpoints"]), new["metrics"].read_bytes()

        second = run_pod(copy, log_dir=logs, name="second", timeout=600)
        assert [p.poll() for p in second.procs] == [8, 8], second.describe()  # the run is live elsewhere
        for i in (0, 1):  # process 0 decided; its peer raised the same refusal (training/distributed.leader_decides)
            assert f"the run is live elsewhere: pid {holder['pid']} on host" in second.output(i), second.describe()
        assert "--take_over true" in second.output(0)
        assert _files(new["checkpoints"]) == checkpoints and new["metrics"].read_bytes() == metrics
        assert json.loads(lease.read_text())["token"] == holder["token"]  # still the live pod's
        assert all(p.poll() is None for p in live.procs), "the live pod was left alone"
    finally:
        live.kill()
