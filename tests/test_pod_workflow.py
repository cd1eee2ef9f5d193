"""A newcomer's round on the pod workflow (issue 25), the fast parts: one-shot actions once per launch, a config
error that ends a launch instead of being retried, and the launcher's exit code on SIGTERM. The launch itself, through
the local pod, is in tests/test_infra_local_ray.py."""

import os
import signal
import sys
import textwrap
import time
import types
from pathlib import Path

import fsspec
import pytest

from levanter_mars.program_config import parse_train_config
from levanter_mars.infra import host, launch
from levanter_mars.training.run import fresh
from levanter_mars.training.run.identity import checkpoint_dir
from levanter_mars.training.run.launch_id import ATTEMPT_STARTED_ENV, LAUNCH_ID_ENV
from tests.helpers.training import POLL_S, tiny_config

#: The launch options run_on_private_cluster reads: one slice.
ONE_SLICE = types.SimpleNamespace(num_slices="1", max_slices=1)


def _config(tmp_path: Path, run_id: str = "once", base_path: str | None = None):
    overrides = {"trainer": {"checkpointer": {"base_path": base_path}}} if base_path else None
    path = tiny_config(tmp_path, tmp_path / "corpus", run_id, overrides)  # parsed only: no corpus needed
    return parse_train_config(["--config_path", str(path)])


def _previous_run(config) -> list[Path]:
    """What an earlier run leaves: its run directory, a checkpoint and Levanter's log file."""
    run = Path(config.trainer.log_dir) / config.trainer.id
    ckpt = Path(checkpoint_dir(config)) / "step-10"
    log = Path(config.trainer.log_dir) / f"{config.trainer.id}.log"
    for directory in (run, ckpt):
        directory.mkdir(parents=True)
        (directory / "old.txt").write_text("old run")
    log.write_text("old run's log\n")
    return [run, ckpt.parent, log]


def test_fresh_is_applied_once_per_launch_and_sets_aside_the_log_too(tmp_path):
    config = _config(tmp_path)
    old = _previous_run(config)
    first = fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"})
    assert [Path(p).name.split(".old-")[0] for p in first] == [p.name for p in old], first
    assert not old[0].exists() and not old[2].exists(), "run dir and log are set aside"
    assert [p.name for p in old[1].iterdir()] == [fresh.FRESH_MARKER], "the new checkpoint dir holds the marker only"
    run, ckpt, log = map(Path, first)
    assert (run / "old.txt").exists() and (ckpt / "step-10" / "old.txt").exists()
    assert log.read_text() == "old run's log\n"
    assert fresh.applied_by(config) == "launch-a"

    # The first attempt trained a while; a retry of the same launch (same command, fresh=true again) resumes it.
    (Path(checkpoint_dir(config)) / "step-10").mkdir()
    assert fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"}) == []
    assert (Path(checkpoint_dir(config)) / "step-10").exists()

    # A new launch with fresh=true starts over again; so does a plain command, every time.
    (Path(checkpoint_dir(config)) / "step-10" / "arrays").write_text("trained by launch-a")
    assert len(fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-b"})) == 1  # the checkpoints (marker inside)
    assert fresh.applied_by(config) == "launch-b"
    (Path(checkpoint_dir(config)) / "step-10").mkdir()
    (Path(checkpoint_dir(config)) / "step-10" / "arrays").write_text("trained by launch-b")
    assert len(fresh.set_aside_run(config, {})) == 1
    assert len(fresh.set_aside_run(config, {})) == 0  # nothing left to set aside
    assert len(list(Path(checkpoint_dir(config)).parent.glob("once.old-*"))) == 3


def test_fresh_sets_aside_checkpoints_in_a_bucket_once_per_launch(tmp_path):
    """Checkpoints on object storage (the pod's case) are moved aside too, through fsspec (here its in-memory
    filesystem), and the once-per-launch marker lives with them, where every host and every attempt sees it."""
    config = _config(tmp_path, "bucket-run", base_path="memory://bucket/ckpt")
    fs = fsspec.filesystem("memory")
    fs.pipe("/bucket/ckpt/bucket-run/step-10/metadata.json", b"{}")
    moved = fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"})
    assert [m for m in moved if m.startswith("memory://")], moved
    assert not fs.exists("/bucket/ckpt/bucket-run/step-10")
    assert [p for p in fs.glob("/bucket/ckpt/bucket-run.old-*/step-10/metadata.json")]
    fs.pipe("/bucket/ckpt/bucket-run/step-20/metadata.json", b"{}")
    assert fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"}) == []
    assert fs.exists("/bucket/ckpt/bucket-run/step-20/metadata.json")
    fs.rm("/bucket", recursive=True)


def _training_module(tmp_path: Path, code: int) -> str:
    """A stand-in for the training program: records its environment, then exits with ``code``."""
    name = f"fake_train_{code}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import json, os, sys
        json.dump(dict(os.environ), open({str(tmp_path / f"{name}.env.json")!r}, "w"))
        sys.exit({code})
    """))
    return name


def test_a_host_returns_how_its_process_ended_and_passes_on_the_launch_id(tmp_path, monkeypatch):
    """run_on_pod retries every exception a host task raises, before the other hosts have ended: a host returns its
    process's exit, whatever it is, and the driver judges all of them together (training/outcome.py)."""
    import json

    monkeypatch.setattr(host, "TRAIN_MODULE", _training_module(tmp_path, 2))
    launcher_clock = 1_800_000_000.25  # the host task's time.time() when it starts the attempt
    monkeypatch.setattr(host, "time", types.SimpleNamespace(time=lambda: launcher_clock))
    result = host.run_host([], str(tmp_path), None, {"HF_TOKEN": "t"}, launch_id="launch-7")
    assert result["returncode"] == 2
    seen = json.loads((tmp_path / "fake_train_2.env.json").read_text())
    assert seen[LAUNCH_ID_ENV] == "launch-7" and seen["HF_TOKEN"] == "t"
    # The goodput record's start of the attempt: the launcher's clock, not the training process's own start.
    assert float(seen[ATTEMPT_STARTED_ENV]) == launcher_clock
    monkeypatch.setattr(host, "TRAIN_MODULE", _training_module(tmp_path, 3))  # a non-finite stop: not retried either
    assert host.run_host([], str(tmp_path), None, {})["returncode"] == 3
    monkeypatch.setattr(host, "TRAIN_MODULE", _training_module(tmp_path, 1))
    result = host.run_host([], str(tmp_path), None, {}, launch_id="launch-7")  # a crash: the driver retries it
    assert result["returncode"] == 1 and result["process"] == (0, 0)


def test_sigterm_stops_the_private_cluster_and_the_launcher_exits_143(tmp_path, monkeypatch, capsys):
    """143 = 128 + SIGTERM, what a shell and a job scheduler expect; 130 is Ctrl-C's."""
    import time

    from levanter_mars.infra import local_cluster

    def start_then_get_terminated(temp_dir, num_hosts, num_slices):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler interrupts this
        raise AssertionError("SIGTERM did not interrupt the launch")

    monkeypatch.setattr(local_cluster.LocalRayCluster, "start", staticmethod(start_then_get_terminated))
    previous = signal.getsignal(signal.SIGTERM)
    code = launch.run_on_private_cluster(None, ONE_SLICE, 1, "test", str(tmp_path / "ray"))
    err = capsys.readouterr().err
    assert code == 143, err
    assert "interrupted: stopping the private Ray cluster" in err and f"kept in {tmp_path / 'ray'}" in err
    assert signal.getsignal(signal.SIGTERM) == previous, "the launcher's handler was not removed"

    def start_then_ctrl_c(temp_dir, num_hosts, num_slices):
        raise KeyboardInterrupt

    monkeypatch.setattr(local_cluster.LocalRayCluster, "start", staticmethod(start_then_ctrl_c))
    assert launch.run_on_private_cluster(None, ONE_SLICE, 1, "test", str(tmp_path / "ray")) == 130


def test_the_private_clusters_client_server_proxy_is_one_of_its_processes(tmp_path):
    """`ray start --head` leaves `python -m ray.util.client.server --address=<GCS> --mode=proxy` behind, orphaned:
    its command line names neither the cluster's temp dir nor a /ray/ path. It outlived every private-cluster
    launch by 50-60 s. Recognised by the cluster's own GCS address, and nobody else's proxy."""
    import subprocess

    from levanter_mars.infra.local_cluster import LocalRayCluster

    cluster = LocalRayCluster(temp_dir=str(tmp_path / "lm-ray-x"), gcs_port=40001)

    def proxy(gcs_port: int) -> subprocess.Popen:
        code = "import time; time.sleep(60)"
        args = ["ray.util.client.server", f"--address=127.0.0.1:{gcs_port}", "--port=10001", "--mode=proxy"]
        return subprocess.Popen([sys.executable, "-c", code, *args])

    own, other = proxy(40001), proxy(40002)
    try:
        assert own.pid in cluster._find_pids() and other.pid not in cluster._find_pids()
        cluster.stop(grace=5)
        assert own.wait(timeout=10) is not None and other.poll() is None
    finally:
        for p in (own, other):
            p.kill()
            p.wait()


def test_stopping_a_local_cluster_interrupts_its_training_processes_before_it_ends_the_rest(tmp_path):
    """The launcher's Ctrl-C stops its private cluster. A training process killed with its Ray worker (it dies with
    its parent) leaves its run's lease and an open goodput attempt behind; so the stop first gives every training
    process on the cluster a person's interrupt (SIGINT, exit 130) and time to act on it. Here a stand-in for the
    training program (``python -m levanter_mars.main.train_lm`` by its command line) records the signals it gets."""
    import subprocess

    import psutil

    from levanter_mars.infra.local_cluster import LocalRayCluster, is_training_process

    fake = tmp_path / "fake" / "levanter_mars" / "main"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    seen = tmp_path / "signals.txt"
    (fake / "train_lm.py").write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        def record(signum, frame):
            open({str(seen)!r}, "a").write(signal.Signals(signum).name + "\\n")
            if signum == signal.SIGINT:
                time.sleep(0.5)  # releasing the lease, closing the record
                sys.exit(130)
        signal.signal(signal.SIGINT, record)
        signal.signal(signal.SIGTERM, record)
        open({str(seen)!r}, "a").write(f"up {{os.getpid()}}\\n")
        time.sleep(60)
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    # Not a child of this process, as a Ray worker's is not (psutil would reap a child, and its code with it): the
    # shell waits for it and exits with its code.
    start = f"{sys.executable} -m levanter_mars.main.train_lm --config_path x.yaml & wait $!"
    shell = subprocess.Popen(["sh", "-c", start], env=env)
    other = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' & wait $!"])
    try:
        deadline = time.monotonic() + 60
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        training = psutil.Process(int(seen.read_text().split()[1]))
        (sleeper,) = psutil.Process(other.pid).children()
        assert is_training_process(training) and not is_training_process(sleeper)
        LocalRayCluster(temp_dir=str(tmp_path / "lm-ray-x"), pids=[training.pid, sleeper.pid]).stop(grace=10)
        assert shell.wait(10) == 130 and seen.read_text().splitlines()[1:] == ["SIGINT"]
        assert other.wait(10) == 128 + signal.SIGTERM  # the cluster's other processes are ended as before
    finally:
        for proc in (shell, other):
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children():
                    child.kill()
                proc.kill()
