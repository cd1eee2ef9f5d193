"""A slice's preemption on the local engine, and its return (levanter_mars/infra/local_preemption.py): one cluster of
2 slices x 1 host, slice 1 preempted and restored through the command line, the cluster's resources read by a Ray
client (in a subprocess: Ray reads its authentication mode at import)."""

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

from levanter_mars.infra.local_cluster import LocalRayCluster
from levanter_mars.infra.local_preemption import node_processes
from tests.helpers.ray_launch import launcher_env
from tests.helpers.training import REPO

# A 2-slice cluster each (about 50 s): ``extended`` (make test-all), with the launcher's limping run that preempts and
# restores a slice (tests/test_infra_local_limping.py). In CI: the refusals, from a cluster's state file alone.

# A Ray client of the cluster: its resources, and with "host" a host task on slice 1 (a detached actor) that
# started a process of its own, as a host task starts its training process.
CLIENT = """
import json, os, subprocess, sys, ray
ray.init(address=sys.argv[1], namespace="preemption", log_to_driver=False)
out = {"resources": ray.cluster_resources()}
if sys.argv[2:] == ["host"]:
    @ray.remote(resources={"local-cpu-1": 1}, num_cpus=1)
    class Host:
        def __init__(self):
            self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        def pids(self):
            return [os.getpid(), self.child.pid]
    out["host_pids"] = ray.get(Host.options(name="host", lifetime="detached").remote().pids.remote(), timeout=120)
print(json.dumps(out))
"""
SLICES = ("local-cpu", "local-cpu-1", "TPU-cpu-head", "TPU")
BOTH_UP = {"local-cpu": 1, "local-cpu-1": 1, "TPU-cpu-head": 2, "TPU": 8}


@pytest.fixture(scope="module")
def cluster():
    temp_dir = tempfile.mkdtemp(prefix="lm-ray-")  # short: Ray's socket paths must fit in 107 bytes
    started = LocalRayCluster.start(temp_dir, num_slices=2)
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not started.is_running(), "processes of the cluster (restored nodes included) survived its stop"
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or ())]
    assert not leftovers, leftovers


def client(cluster, *args) -> dict:
    env = launcher_env(cluster.client_env(), {})
    proc = subprocess.run([sys.executable, "-c", CLIENT, cluster.gcs_address, *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    out["slices"] = {k: out["resources"][k] for k in SLICES if k in out["resources"]}
    return out


def local_cluster(cluster, *args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "levanter_mars.infra.local_cluster", *args, "--temp_dir", cluster.temp_dir]
    env = launcher_env({}, {})
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.extended
def test_a_preempted_slice_leaves_the_cluster_and_comes_back(cluster):
    up = client(cluster, "host")
    assert up["slices"] == BOTH_UP
    slice_1 = node_processes(cluster, 1)  # its raylet and all under it
    assert set(up["host_pids"]) <= {p.pid for p in slice_1}, "the host task and its process run under slice 1's raylet"
    try:
        preempted = local_cluster(cluster, "preempt", "--slice", "1")
        assert preempted.returncode == 0, preempted.stderr[-4000:]
        print(preempted.stdout)
        assert not [p.pid for p in slice_1 if p.is_running()], "a process of slice 1 outlived its preemption"
    finally:
        for proc in slice_1:  # psutil checks that the pid was not reused
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    assert "preempted slice 1 (local-cpu-1, 1 node(s))" in preempted.stdout and "restore" in preempted.stdout
    assert client(cluster)["slices"] == {"local-cpu": 1, "TPU-cpu-head": 1, "TPU": 4}, "slice 0 stays, alone"

    restored = local_cluster(cluster, "restore", "--slice", "1")
    assert restored.returncode == 0, restored.stderr[-4000:]
    assert "slice 1 (local-cpu-1) is back" in restored.stdout, restored.stdout
    assert client(cluster)["slices"] == BOTH_UP

    again = local_cluster(cluster, "preempt", "--slice", "1", "--down_s", "1")
    assert again.returncode == 0, again.stderr[-4000:]
    print(again.stdout)
    assert "preempted slice 1" in again.stdout and "slice 1 (local-cpu-1) is back" in again.stdout
    assert client(cluster)["slices"] == BOTH_UP


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.extended
def test_preempting_the_head_slice_or_an_unknown_one_or_restoring_an_up_one_is_refused_and_touches_nothing(cluster):
    raylets = [node_processes(LocalRayCluster.load(cluster.temp_dir), node)[0] for node in (0, 1)]
    head = local_cluster(cluster, "preempt", "--slice", "0")
    assert head.returncode == 2 and "--slice 0: slice 0's host 0 is the cluster's head" in head.stderr, head.stderr
    unknown = local_cluster(cluster, "preempt", "--slice", "2")
    assert unknown.returncode == 2 and "--slice 2: no such slice" in unknown.stderr, unknown.stderr
    up = local_cluster(cluster, "restore", "--slice", "1")
    assert up.returncode == 2 and "--slice 1: slice 1 is up (1 of 1 node(s) alive)" in up.stderr, up.stderr
    assert all(raylet.is_running() for raylet in raylets)


def test_the_head_slice_an_unknown_slice_and_a_cluster_without_node_ports_are_refused_before_any_ray(tmp_path):
    """From the state file alone, before Ray is imported (nothing listens here: a refusal must not need a cluster)."""
    state = LocalRayCluster(str(tmp_path), gcs_port=1, dashboard_port=2, num_hosts=1, num_slices=2,
                            node_manager_ports=[3, 4])  # fmt: skip
    state.save()
    head = local_cluster(state, "preempt", "--slice", "0")
    assert head.returncode == 2 and "--slice 0: slice 0's host 0 is the cluster's head" in head.stderr, head.stderr
    unknown = local_cluster(state, "restore", "--slice", "2")
    assert unknown.returncode == 2 and "--slice 2: no such slice" in unknown.stderr, unknown.stderr
    LocalRayCluster(str(tmp_path), num_hosts=1, num_slices=2).save()  # an older version's: no node ports
    older = local_cluster(state, "preempt", "--slice", "1")
    assert older.returncode == 2 and "names no node's ports" in older.stderr, older.stderr


def test_a_cluster_that_is_gone_is_refused_by_name_not_asked(tmp_path):
    """The launcher keeps a private cluster's directory (Ray's logs) after a run that did not finish, and stops the
    cluster: its state file outlives it. `restore` of a slice there said nothing of that (a Ray AuthenticationError
    from asking a GCS that is gone); it is refused from the state file and the processes alone."""
    state = LocalRayCluster(str(tmp_path), gcs_port=1, dashboard_port=2, num_hosts=1, num_slices=2,
                            node_manager_ports=[3, 4])  # fmt: skip
    state.save()
    for command in ("restore", "preempt"):
        gone = local_cluster(state, command, "--slice", "1")
        assert gone.returncode == 2 and f"that cluster is gone: no process of the cluster in {tmp_path}" in gone.stderr
        assert "Traceback" not in gone.stderr, gone.stderr


def test_the_notice_goes_to_the_training_processes_first():
    """``preempt`` gives a slice's training processes their notice (SIGTERM, up to NOTICE_S to save and exit 9) before
    the rest of the slice goes: found among a node's processes by their command line."""
    from levanter_mars.infra.host import TRAIN_MODULE
    from levanter_mars.infra.local_preemption import training_processes

    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", TRAIN_MODULE])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        procs = [psutil.Process(training.pid), psutil.Process(other.pid)]
        assert [p.pid for p in training_processes(procs)] == [training.pid]
    finally:
        for proc in (training, other):
            proc.kill()
            proc.wait()
