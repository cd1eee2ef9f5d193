"""tests/helpers/pod.py: a pod that hangs fails the test, its stacks dumped into its logs, and is never run again (a
retry would let a regression that hangs some pods pass most of the time); a hang is found by its logs' silence long
before the timeout, and a pod that keeps writing is not hung however long it runs."""

import subprocess
import sys

import pytest

from tests.helpers import pod

HANGS = "import time; time.sleep(120)"


def _fake_start(tmp_path, code: str):
    """``start_pod`` replaced by two processes running ``code``; returns it and the list of its calls."""
    started = []

    def start(config_path, *extra, **kwargs):
        started.append(config_path)
        logs = [tmp_path / f"attempt-{len(started)}.process-{i}.log" for i in range(2)]
        procs = []
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], stdout=out,
                                              stderr=subprocess.STDOUT))
        return pod.PodRun(procs, logs)

    return start, started


def _assert_stacks_dumped(tmp_path):
    for i in range(2):
        stack = (tmp_path / f"attempt-1.process-{i}.log").read_text()
        assert "Fatal Python error: Aborted" in stack and 'File "<string>", line 1' in stack, "its stack was dumped"


def test_a_hung_pod_fails_with_its_stacks_dumped_and_is_not_run_again(tmp_path, monkeypatch):
    start, started = _fake_start(tmp_path, HANGS)
    monkeypatch.setattr(pod, "start_pod", start)
    with pytest.raises(pod.PodHung, match="not done after 3 s") as hung:
        pod.run_pod(tmp_path / "r.yaml", timeout=3)
    assert len(started) == 1, "a hung pod was started again"
    _assert_stacks_dumped(tmp_path)
    assert "--- process 1: exit -6 ---" in str(hung.value), "the error shows every process's end and log"


def test_a_pod_whose_logs_stay_still_is_hung_long_before_its_timeout(tmp_path, monkeypatch):
    """ci8's deadlocked reference pod was found at its 600 s timeout: one whose processes all run and write nothing
    for HUNG_AFTER_SILENCE_S is hung then (the message says which of the two found it)."""
    start, started = _fake_start(tmp_path, HANGS)
    monkeypatch.setattr(pod, "start_pod", start)
    monkeypatch.setattr(pod, "HUNG_AFTER_SILENCE_S", 2)
    with pytest.raises(pod.PodHung, match="no log grew for 2 s"):
        pod.run_pod(tmp_path / "r.yaml", timeout=3600)
    assert len(started) == 1
    _assert_stacks_dumped(tmp_path)


def test_a_pod_that_keeps_writing_is_not_hung_however_long_it_runs(tmp_path, monkeypatch):
    """It runs 6 s, longer than the silence that makes a pod hung, writing every 0.5 s."""
    writing = "import time\nfor i in range(12):\n    print(i, flush=True)\n    time.sleep(0.5)"
    start, started = _fake_start(tmp_path, writing)
    monkeypatch.setattr(pod, "start_pod", start)
    monkeypatch.setattr(pod, "HUNG_AFTER_SILENCE_S", 4)
    done = pod.run_pod(tmp_path / "r.yaml", timeout=3600)
    assert len(started) == 1 and [p.returncode for p in done.procs] == [0, 0]
