"""The launcher end to end on the local engine: real Ray clusters on 127.0.0.1 (started and stopped by their own
process ids), the tiny config, Levanter's run_on_pod, and kills of training processes and of Ray workers.

One long-lived cluster (one host) serves the module; the local pod of two hosts runs on the private cluster the
launcher starts itself. The references are runs of the same config without Ray.
"""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from levanter_mars.infra.local_cluster import STATE_FILE, LocalRayCluster
from tests.helpers.pod import SURVIVOR_DEADLINE_S
from tests.helpers.ray_launch import (
    files_containing,
    launched,
    launcher_command,
    launcher_env,
    training_process,
    training_processes,
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


@pytest.mark.extended  # a long-lived cluster (--address): the private-cluster pod test covers the engine in CI
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


def _previous_run(workdir, run_id: str) -> dict[str, Path]:
    """What an earlier run of ``run_id`` left behind, for ``fresh=true`` to set aside."""
    paths = run_paths(workdir, run_id)
    old = {"run_dir": paths["run_dir"], "checkpoints": paths["checkpoints"] / "step-99"}
    old["log"] = workdir / "runs" / f"{run_id}.log"
    for key in ("run_dir", "checkpoints"):
        old[key].mkdir(parents=True)
        (old[key] / "OLD_RUN").write_text("the previous run")
    old["log"].write_text("OLD_RUN's log\n")
    return old


@pytest.mark.extended  # CI budget (220 s): the engine runs in CI in the decided-stop test below
def test_local_pod_of_two_hosts_survives_a_killed_process_and_resumes_bitwise(workdir, pydocs_corpus, pod_reference):
    """One command (no --address: the launcher starts and stops its own cluster), 2 hosts x 2 devices, with
    ``--fresh true`` and W&B on. A dead host's retry resumes the run the first attempt started (fresh=true is
    applied once per launch), only process 0 writes a W&B run, Levanter's log is ``<run id>.log``, and nothing of
    the private cluster, its client-server proxy included, is left behind. (A lost Ray worker, a preemption, is
    retried on its own budget: tests/test_infra_gcloud.py checks the counting.)

    The config names a compilation cache, which an XLA:CPU pod turns off (programs loaded from it have deadlocked
    simulated pods, docs/reliability.md): both attempts compile every program and store none; a retry loading its
    programs is held by tests/test_gcs.py (one process). The goodput record (process 0's, completed by the retry for
    the attempt that died) shows both attempts. On 4cb100e there was no record."""
    run_id = "pod-killed"
    tracker = {"type": "wandb", "mode": "offline", "project": "pod-workflow"}
    cache = workdir / "pod-killed-compile-cache"
    overrides = {"trainer": {"tracker": tracker, "compilation_cache": str(cache)}}
    config = tiny_config(workdir, pydocs_corpus, run_id, overrides)
    old = _previous_run(workdir, run_id)
    metrics = run_paths(workdir, run_id)["metrics"]
    log_path = workdir / f"{run_id}.launcher.log"
    env = {**launcher_env({}, SECRETS), "WANDB_DIR": str(workdir / "wandb-pod")}
    env.pop("RAY_ADDRESS", None)
    (workdir / "wandb-pod").mkdir()
    flags = ("--num_hosts", "2", "--devices_per_host", "2", "--retries", "1", "--preemption_retries", "0")
    with launched(config, env, log_path, *flags, "--", "--fresh", "true") as launcher:
        # A failure: host 1's training process dies (SIGKILL) after the step-10 checkpoint; host 0 must not linger.
        first = wait_for(lambda: len(ps := training_processes(config)) == 2 and ps, what="both training processes")
        temp_dir = re.search(r"starting a private Ray cluster .* in (\S+)", log_path.read_text()).group(1)
        gcs_port = json.loads((Path(temp_dir) / STATE_FILE).read_text())["gcs_port"]
        for proc in first:
            environ = proc.environ()
            assert {k: environ.get(k) for k in SECRETS} == SECRETS, "credentials did not reach a training process"
            assert not [k for k in environ if k.startswith("TPU_")]
            assert environ["XLA_FLAGS"].endswith("--xla_force_host_platform_device_count=2")
        wait_for(lambda: metrics.exists() and last_step(metrics) >= 14, what="step 14")
        survivor, victim = first
        victim.kill()
        killed_at = time.monotonic()
        wait_for(lambda: not survivor.is_running(), timeout=SURVIVOR_DEADLINE_S, what="host 0 to end after host 1 died")
        survivor_s = time.monotonic() - killed_at
        old_pids = {p.pid for p in first}
        second = wait_for(
            lambda: len(ps := training_processes(config)) == 2 and not old_pids & {p.pid for p in ps} and ps,
            what="a restart of both hosts",
        )
        assert all(p.parent().cmdline()[0].startswith("ray::") for p in second), "hosts run as Ray tasks"
        code = launcher.wait(timeout=900)
    proxy_flag = f"--address=127.0.0.1:{gcs_port}"
    proxies = [p.pid for p in psutil.process_iter(["cmdline"]) if proxy_flag in (p.info["cmdline"] or ())]
    log = log_path.read_text()
    print(f"host 0 ended {survivor_s:.1f} s after host 1 was killed")
    assert code == 0, log[-6000:]
    assert ": SUCCEEDED" in log and "Running on 1 x TPU cpu" in log
    assert log.count("launch retry: a host crashed or was killed") == 1 and "(failure 1 of 1)" in log, log[-6000:]
    assert "a host was lost" not in log, "one failure, not counted as a preemption"
    # fresh=true: the old run set aside by the first attempt only (run dir, checkpoints, log: 3 moves); the retry
    # resumed the first attempt's checkpoint.
    assert log.count("fresh=true: moved") == 3, log[-6000:]
    assert log.count("fresh=true was applied by an earlier attempt of this launch") == 1
    assert sorted(set(re.findall(r"Resuming from \S+/(step-\d+)", log))) == ["step-10"]
    aside = list(old["checkpoints"].parent.parent.glob(f"{run_id}.old-*"))
    assert len(aside) == 1 and (aside[0] / "step-99" / "OLD_RUN").exists()
    lines = metrics.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses
    assert sorted(r["step"] for r in records if "train/loss" in r) == list(range(30)), "every step exactly once"
    got = losses(metrics)
    reference = losses(pod_reference[2]["metrics"])  # the same tiny run as 2 processes started by hand, no Ray
    mismatches = {s: (got[s], reference[s]) for s in reference if got[s] != reference[s]}
    assert not mismatches, mismatches
    # Levanter's log is <log_dir>/<run id>.log, both hosts' lines, and not appended to the old run's.
    assert not (workdir / "runs" / f"{run_id}.log.log").exists()
    run_log = old["log"].read_text()
    assert "OLD_RUN" not in run_log and " - 1 - " in run_log and " - 0 - " in run_log
    # W&B: one offline run with data per attempt, process 0's (Levanter inits its tracker twice in process 0, the
    # second time into the same run: that directory holds a debug log only).
    assert len(list((workdir / "wandb-pod" / "wandb").glob("offline-run-*/run-*.wandb"))) == 2
    # The private cluster is gone, with every process it started, its client-server proxy included.
    assert not os.path.exists(temp_dir)
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if any(temp_dir in a for a in p.info["cmdline"] or ())]
    assert not proxies, f"the private cluster's client-server proxy outlived it: {proxies}"
    _assert_the_cache_was_off_and_the_record_has_both_attempts(workdir / "runs" / run_id, cache)


def _assert_the_cache_was_off_and_the_record_has_both_attempts(run_dir, cache):
    from levanter_mars.training.run.goodput import read_record

    record = read_record(run_dir / "goodput.json")
    first, retry = record["attempts"]
    print("goodput.json:", json.dumps(record, indent=1))
    assert first["launch_id"] == retry["launch_id"] and (first["attempt"], retry["attempt"]) == (1, 2)
    assert retry["exit_code"] == 0 and retry["first_step"] == 11 and retry["last_step"] == 29
    assert first["last_step"] >= 14 and first["seconds"]["lost"] > 0, "the steps after step 10 were trained twice"
    for attempt in (first, retry):
        assert attempt["compile_cache"]["hits"] == attempt["compile_cache"].get("stored", 0) == 0, attempt
    # Times are measured, not asserted (a retry still traces and lowers every program): the record shows them.
    assert 0 < record["goodput"] < 1
    assert not list(cache.glob("jit_*")), "nothing was written to the cache the config names"
    assert (run_dir / "goodput.png").exists()


def test_a_missing_training_file_ends_the_launch_before_any_host_starts(workdir, pydocs_corpus, tmp_path):
    """The launcher runs the training program's own validation: a data file that is not there is exit 2 before a Ray
    cluster starts. On 4cb100e a cluster started, two hosts started 43 s later and each failed with exit 2."""
    data = {"train_urls": [str(tmp_path / "train.jsonl")], "cache_dir": str(tmp_path / "tokenized")}
    config = tiny_config(workdir, pydocs_corpus, "pod-no-data", {"data": data})
    env = launcher_env({}, {})
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(launcher_command(config, "--num_hosts", "2"), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    log = output(proc)
    assert proc.returncode == 2, log[-6000:]
    assert f"config error: data.train_urls[0]: no such file {str(tmp_path / 'train.jsonl')!r}" in log
    assert "starting a private Ray cluster" not in log and "Traceback" not in log, log[-6000:]


def test_a_stop_the_run_decides_ends_the_launch_with_the_runs_own_exit_code(workdir, pydocs_corpus):
    """A non-finite stop (``trainer.nonfinite: stop``; an initialization so large that the first gradients overflow)
    is exit 3, on the host and from the launcher, after one attempt: a retry would stop the same way. On 4cb100e it was
    exit 1, retried as a crash."""
    overrides = {"model": {"initializer_range": 1e37}, "trainer": {"nonfinite": "stop"}}
    config = tiny_config(workdir, pydocs_corpus, "pod-nonfinite", overrides)
    env = launcher_env({}, {})
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        launcher_command(config, "--retries", "3"), cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    log = output(proc)
    assert proc.returncode == 3, log[-6000:]
    assert log.count("Running on 1 x TPU cpu") == 1, "the stop was retried"
    assert "step 0: NaN/Inf" in log and "exit 3 (nonfinite stop)" in log and "not retried" in log, log[-6000:]


@pytest.mark.extended  # a long-lived cluster (--address): the private-cluster pod test covers the engine in CI
def test_out_of_retries_the_job_fails_loudly(cluster, workdir, pydocs_corpus):
    config = tiny_config(workdir, pydocs_corpus, "ray-doomed")
    log_path = workdir / "ray-doomed.log"
    env = launcher_env(cluster.client_env(), {})
    with launched(config, env, log_path, "--retries", "0", "--preemption_retries", "0") as launcher:
        wait_for(lambda: training_process(config), what="the training process").kill()
        code = launcher.wait(timeout=600)
    log = log_path.read_text()
    assert code == 1, log[-4000:]
    assert "launch give up: a host crashed or was killed (process 0: signal SIGKILL)" in log, log[-4000:]
    assert "the failure retries are spent (0 of 0)" in log and ": FAILED" in log, log[-4000:]


def test_the_launcher_imports_ray_only_after_it_set_up_its_client():
    """Ray reads its authentication mode once, at import: the private cluster's client must be set up before."""
    code = "import sys, levanter_mars.infra.launch; assert 'ray' not in sys.modules, 'ray imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_defect_23_ray_start_refuses_to_add_a_node_whose_listeners_stay_on_loopback(tmp_path):
    """The reason for levanter_mars.compat.ray_local_nodes (the two-host test above proves its workaround)."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    command = [ray_bin, "start", "--address", "127.0.0.1:9", "--node-ip-address", "127.0.0.1"]
    command += ["--temp-dir", str(tmp_path)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Multi-node Ray clusters are not supported" in proc.stdout + proc.stderr
