"""tests/helpers/pod.py: a pod that hangs is retried once from where it started (the paths it writes put back), with
its stacks kept; a pod that hangs again, or whose process failed, is an error."""

import subprocess
import sys
import time

import pytest

from tests.helpers import pod


def _fake_start(tmp_path, hangs: int, hung: str = "import time; time.sleep(120)", on_start=lambda attempt: None):
    started = []

    def start(config_path, *extra, **kwargs):
        started.append(config_path)
        on_start(len(started))
        code = hung if len(started) <= hangs else "pass"
        logs = [tmp_path / f"attempt-{len(started)}.process-{i}.log" for i in range(2)]
        procs = []
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], stdout=out,
                                              stderr=subprocess.STDOUT))
        return pod.PodRun(procs, logs)

    return start, started


def test_a_hung_pod_is_retried_once_from_where_it_started_and_its_stacks_are_kept(tmp_path, monkeypatch):
    checkpoints, run_dir, log = outputs = pod.reference_outputs(tmp_path, "r")
    checkpoints.mkdir(parents=True)
    (checkpoints / "step-10").write_text("the checkpoint a rerun resumes from")
    seen_by_retry = []

    def on_start(attempt):
        if attempt == 1:  # the attempt that hangs writes into all of them
            (checkpoints / "step-10").write_text("torn")
            (checkpoints / "step-20").write_text("partial")
            run_dir.mkdir(parents=True)
            log.write_text("log of the hung attempt")
        else:
            seen_by_retry.append((sorted(p.name for p in checkpoints.iterdir()), (checkpoints / "step-10").read_text(),
                                  run_dir.exists(), log.exists()))

    start, started = _fake_start(tmp_path, hangs=1, on_start=on_start)
    monkeypatch.setattr(pod, "start_pod", start)
    done = pod.run_pod(tmp_path / "r.yaml", timeout=3, retry_restoring=outputs)
    assert len(started) == 2 and [p.returncode for p in done.procs] == [0, 0]
    assert seen_by_retry == [(["step-10"], "the checkpoint a rerun resumes from", False, False)]
    stack = (tmp_path / "attempt-1.process-0.log").read_text()
    assert "Fatal Python error: Aborted" in stack and 'File "<string>", line 1' in stack, "its Python stack was dumped"


def test_a_pod_that_hangs_twice_or_without_a_retry_fails(tmp_path, monkeypatch):
    start, started = _fake_start(tmp_path, hangs=3)
    monkeypatch.setattr(pod, "start_pod", start)
    with pytest.raises(pod.PodHung, match="not done after 3 s"):
        pod.run_pod(tmp_path / "r.yaml", timeout=3, retry_restoring=pod.reference_outputs(tmp_path, "r"))
    assert len(started) == 2
    with pytest.raises(pod.PodHung):
        pod.run_pod(tmp_path / "r.yaml", timeout=3)
    assert len(started) == 3


def test_a_reference_pod_whose_logs_stay_still_is_hung_long_before_its_timeout(tmp_path, monkeypatch):
    """ci8's deadlocked reference pod was found at its 600 s timeout: one whose processes all run and write nothing
    for HUNG_AFTER_SILENCE_S is retried then."""
    start, started = _fake_start(tmp_path, hangs=1)
    monkeypatch.setattr(pod, "start_pod", start)
    monkeypatch.setattr(pod, "HUNG_AFTER_SILENCE_S", 2)
    began = time.monotonic()
    done = pod.run_pod(tmp_path / "r.yaml", timeout=100, retry_restoring=pod.reference_outputs(tmp_path, "r"))
    assert len(started) == 2 and [p.returncode for p in done.procs] == [0, 0]
    assert time.monotonic() - began < 50, "found at the timeout, not by its silence"
    assert "Fatal Python error: Aborted" in (tmp_path / "attempt-1.process-0.log").read_text()


def test_a_pod_that_keeps_writing_is_not_hung_however_long_it_runs(tmp_path, monkeypatch):
    writing = "import time\nfor i in range(12):\n    print(i, flush=True)\n    time.sleep(0.5)"
    start, started = _fake_start(tmp_path, hangs=1, hung=writing)
    monkeypatch.setattr(pod, "start_pod", start)
    monkeypatch.setattr(pod, "HUNG_AFTER_SILENCE_S", 2)
    done = pod.run_pod(tmp_path / "r.yaml", timeout=100, retry_restoring=pod.reference_outputs(tmp_path, "r"))
    assert len(started) == 1 and [p.returncode for p in done.procs] == [0, 0]
