"""The launcher end to end on the local engine: a real Ray cluster on 127.0.0.1 (started and stopped here, by its
own process ids), the tiny config, Levanter's run_on_pod, and kills of the training process and of its Ray worker.

One cluster serves the module. The reference is a run of the same config without Ray.
"""

import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

from levanter_mars.infra.local_cluster import LocalRayCluster
from tests.helpers.ray_launch import (
    files_containing,
    launched,
    launcher_command,
    launcher_env,
    training_process,
    wait_for,
)
from tests.helpers.training import REPO, describe_failure, last_step, losses, output, run_cli, run_paths, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SECRETS = {"WANDB_API_KEY": f"wandb-{secrets.token_hex(8)}", "HF_TOKEN": f"hf_{secrets.token_hex(8)}"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("ray-e2e")


@pytest.fixture(scope="module")
def cluster():
    temp_dir = tempfile.mkdtemp(prefix="lm-ray-")  # short: Ray's socket paths must fit in 107 bytes
    # Processes that a careless stop would take down: one reading this cluster's logs, one named like Ray.
    decoys = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(900)", f"{temp_dir}/session_latest/logs/raylet.out"]
        ),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "raylet", "gcs_server", "ray::IDLE"]),
    ]
    started = LocalRayCluster.start(temp_dir)
    try:
        yield started
    finally:
        stopped = started.stop()
        alive = [d.poll() is None for d in decoys]
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert stopped and not started.is_running(), "processes of the cluster survived its stop"
    assert all(alive), "stopping the cluster ended processes that were not its own"
    leftovers = [
        p.pid for p in psutil.process_iter(["cmdline"]) if any(temp_dir in a for a in p.info["cmdline"] or ())
    ]
    assert not leftovers, leftovers
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", started.dashboard_port)) != 0, "the job API still listens"


@pytest.fixture(scope="module")
def reference(workdir, pydocs_corpus):
    """The tiny run without Ray: what every Ray run must reproduce bit for bit."""
    proc = run_cli(tiny_config(workdir, pydocs_corpus, "no-ray"))
    assert proc.returncode == 0, describe_failure(proc)
    return losses(run_paths(workdir, "no-ray")["metrics"])


def assert_no_secret_written(cluster, workdir, *texts):
    for text in texts:
        for value in SECRETS.values():
            assert value not in text
    leaked = files_containing([cluster.temp_dir, workdir], SECRETS.values())
    assert not leaked, f"credentials written to {leaked}"


def test_tiny_run_finishes_on_the_local_engine_with_checkpoints(cluster, workdir, pydocs_corpus, reference):
    config = tiny_config(workdir, pydocs_corpus, "ray-plain")
    proc = subprocess.run(
        launcher_command(config), cwd=REPO, env=launcher_env(cluster.client_env(), SECRETS),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, describe_failure(proc)
    log = output(proc)
    assert "submitted Ray job levanter-mars-ray-plain-" in log and ": SUCCEEDED" in log
    assert "Running on 1 x TPU cpu" in log, "Levanter's run_on_pod did the scheduling"
    paths = run_paths(workdir, "ray-plain")
    assert sorted(int(p.name.split("-")[1]) for p in paths["checkpoints"].glob("step-*")) == [10, 20, 29]
    assert losses(paths["metrics"]) == reference
    assert_no_secret_written(cluster, workdir, log)


def test_killed_training_process_then_lost_worker_both_resume_bitwise(cluster, workdir, pydocs_corpus, reference):
    run_id = "ray-killed"
    config = tiny_config(workdir, pydocs_corpus, run_id)
    metrics = run_paths(workdir, run_id)["metrics"]
    log_path = workdir / f"{run_id}.log"
    env = launcher_env(cluster.client_env(), SECRETS)
    with launched(config, env, log_path, "--retries", "1", "--preemption_retries", "1") as launcher:
        # A failure: the training program dies (SIGKILL) after the step-10 checkpoint.
        first = wait_for(lambda: training_process(config), what="the first training process")
        environ = first.environ()
        assert {k: environ.get(k) for k in SECRETS} == SECRETS, "credentials did not reach the training process"
        assert not [k for k in environ if k.startswith("TPU_")]
        wait_for(lambda: metrics.exists() and last_step(metrics) >= 14, what="step 14")
        first.kill()
        # A preemption: the Ray worker that hosts the second attempt dies; its training process goes with it.
        second = wait_for(lambda: (p := training_process(config)) and p.pid != first.pid and p, what="a restart")
        worker = second.parent()
        assert worker.cmdline()[0].startswith("ray::"), worker.cmdline()
        wait_for(lambda: last_step(metrics) >= 24, what="step 24 of the second attempt")
        worker.kill()
        wait_for(lambda: not second.is_running(), timeout=30, what="the orphaned training process to die")
        code = launcher.wait(timeout=600)
    log = log_path.read_text()
    assert code == 0, log[-6000:]
    assert ": SUCCEEDED" in log
    assert "Failed 1 times" in log and "Preempted 1 times" in log, "one failure and one preemption, counted apart"
    assert sorted(set(re.findall(r"Resuming from \S+/(step-\d+)", log))) == ["step-10", "step-20"]
    got = losses(metrics)
    assert sorted(got) == list(range(30)), "every step once in the resumed metrics"
    mismatches = {s: (got[s], reference[s]) for s in reference if got[s] != reference[s]}
    assert not mismatches, mismatches
    assert_no_secret_written(cluster, workdir, log)


def test_out_of_retries_the_job_fails_loudly(cluster, workdir, pydocs_corpus):
    config = tiny_config(workdir, pydocs_corpus, "ray-doomed")
    log_path = workdir / "ray-doomed.log"
    env = launcher_env(cluster.client_env(), {})
    with launched(config, env, log_path, "--retries", "0", "--preemption_retries", "0") as launcher:
        wait_for(lambda: training_process(config), what="the training process").kill()
        code = launcher.wait(timeout=600)
    log = log_path.read_text()
    assert code == 1, log[-4000:]
    assert "error: gave up after retries" in log and "ended with signal SIGKILL" in log
    assert ": FAILED" in log
