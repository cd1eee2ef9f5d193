"""The local pod without a cluster: its dry run, the flags and devices each host gets (also with several slices), the
coordinator rendezvous, and the driver's check that the cluster has the pod's shape. The pod itself runs in
test_infra_local_ray.py."""

import asyncio
import os
import shlex
import socket
from pathlib import Path

import pytest

from levanter_mars.infra import host, pod, rendezvous
from levanter_mars.infra.config import LaunchError
from levanter_mars.infra.local_node import LOCAL_SLICE_NAME
from levanter_mars.infra.slices import local_slice
from tests.helpers.ray_launch import contact_nothing, dry_run  # noqa: F401 - an autouse fixture
from tests.helpers.training import tiny_config


def test_local_engine_refuses_a_cluster_that_would_leave_it_waiting():
    # What `ray start` with the README's recipe offers (Ray adds the slice name and the pose's head resource).
    started_right = {"TPU-cpu-head": 1, "TPU-v4-8-head": 1, LOCAL_SLICE_NAME: 1, "TPU": 4, "CPU": 9, "memory": 21e9}
    pod.check_local_cluster(started_right, local_slice(1))
    plain_ray_start = {"CPU": 2, "memory": 15e9, "node:127.0.0.1": 1}
    with pytest.raises(LaunchError) as error:
        pod.check_local_cluster(plain_ray_start, local_slice(1))
    assert "TPU-cpu-head" in str(error.value) and "ray start --head" in str(error.value)
    # A one-host cluster cannot run two hosts (Levanter's scheduler would wait for the second forever).
    with pytest.raises(LaunchError) as error:
        pod.check_local_cluster(started_right, local_slice(2))
    assert "TPU-v4-16-head" in str(error.value) and "local_cluster start --num_hosts 2" in str(error.value)
    two_nodes = {"TPU-cpu-head": 1, "TPU-v4-16-head": 1, LOCAL_SLICE_NAME: 2, "TPU": 8, "CPU": 18, "memory": 42e9}
    pod.check_local_cluster(two_nodes, local_slice(2))
    with pytest.raises(LaunchError, match="TPU-v4-8-head"):
        pod.check_local_cluster(two_nodes, local_slice(1))


def test_local_pod_dry_run_plans_one_process_per_host_with_its_devices(capsys, monkeypatch, tmp_path, pydocs_corpus):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tiny_config(tmp_path, pydocs_corpus, "pod-dry")
    argv = ["--config_path", str(config), "--tpu_type", "cpu", "--num_hosts", "4", "--devices_per_host", "2"]
    plan, _, _ = dry_run(capsys, *argv)
    assert plan["hosts"] == {"per_slice": 4, "total": 4}
    assert plan["mesh"]["devices"] == 8 and plan["mesh"]["mesh_axes"] == {"replica": 1, "data": 8, "model": 1}
    assert plan["resources"]["total"] == {"TPU-cpu-head": 1, "TPU": 16, "CPU": 32, "memory": 80 * 10**9}
    entry = shlex.split(plan["ray_job"]["entrypoint"])
    assert entry[entry.index("--num_hosts") + 1] == "4" and entry[entry.index("--devices_per_host") + 1] == "2"
    per_host = plan["local_pod"]["per_host"]
    assert per_host["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    flags = per_host["training_flags"]
    assert flags[flags.index("--trainer.distributed.num_processes") + 1] == "4"
    assert plan["address"].startswith("a private Ray cluster on 127.0.0.1")
    plan, _, _ = dry_run(capsys, *argv, "--address", "http://127.0.0.1:8265")
    assert plan["address"] == "http://127.0.0.1:8265"


def test_a_local_host_gets_its_devices_and_with_peers_the_distributed_flags(monkeypatch):
    assert host.with_device_count("--xla_a=1 --xla_force_host_platform_device_count=8 --xla_b", 2) == (
        "--xla_a=1 --xla_b --xla_force_host_platform_device_count=2"
    )
    one = host.LocalHost(num_hosts=1, devices_per_host=3)
    flags, env = host.local_host_setup(one, {"XLA_FLAGS": ""})
    assert (flags, env) == ([], {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"})
    asked = []
    monkeypatch.setattr(rendezvous, "coordinator_port", lambda name, worker: asked.append((name, worker)) or 41234)
    two = host.LocalHost(num_hosts=2, devices_per_host=1, rendezvous="r-1")
    flags, env = host.local_host_setup(two, {"TPU_WORKER_ID": "1"})
    assert asked == [("r-1", 1)]  # the node's worker id is the process id, as Levanter's scheduler placed it
    assert flags == [
        "--trainer.distributed.coordinator_address", "127.0.0.1:41234",
        "--trainer.distributed.num_processes", "2",
        "--trainer.distributed.process_id", "1",
    ]  # fmt: skip


def test_rendezvous_gives_every_host_of_an_attempt_one_free_port_and_forgets_dead_attempts():
    never_a_pid = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below pid_max

    async def attempts():
        meeting = rendezvous.Rendezvous(num_hosts=2)
        # Host 1 of a cancelled attempt asked, then died; host 0 of the next attempt must not pair with it.
        # Tasks start in the order they were created (asyncio runs ready callbacks first in, first out): the stale
        # one asks first. No sleep decides the order; the timeout only bounds a broken rendezvous.
        stale = asyncio.ensure_future(meeting.coordinator_port(1, never_a_pid))
        first = asyncio.ensure_future(meeting.coordinator_port(0, os.getpid()))
        await asyncio.wait([stale], timeout=60)
        assert stale.cancelled() and not first.done()
        second = await meeting.coordinator_port(1, os.getpid())
        return await first, second

    port, same = asyncio.run(attempts())
    assert port == same
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: nobody holds it


def test_the_nodes_of_a_multi_slice_local_pod_pose_as_distinct_slices_numbered_slice_major():
    from levanter_mars.infra.local_cluster import node_resources
    from levanter_mars.infra.local_node import node_identity, node_position, slice_name

    assert [node_position(n, 2) for n in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [slice_name(s) for s in range(3)] == [LOCAL_SLICE_NAME, f"{LOCAL_SLICE_NAME}-1", f"{LOCAL_SLICE_NAME}-2"]
    # Slice 1's second host: its own slice name (what Levanter's slice actor places its hosts by), its place in it.
    assert node_identity(2, 1, 1) == {
        "TPU_NAME": f"{LOCAL_SLICE_NAME}-1", "TPU_WORKER_ID": "1", "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_TOPOLOGY": "2x2x2",
    }  # fmt: skip
    assert node_identity() == node_identity(1, 0, 0)  # one slice: named as before
    assert "TPU-cpu-head" in node_resources(0) and "TPU-cpu-head" not in node_resources(1)  # worker 0 of each slice


def test_local_engine_refuses_a_cluster_with_fewer_slices_than_the_launch():
    # Two one-host slices, as LocalRayCluster.start(num_hosts=1, num_slices=2) starts them (Ray adds the names).
    two_slices = {
        "TPU-cpu-head": 2, "TPU-v4-8-head": 2, LOCAL_SLICE_NAME: 1, f"{LOCAL_SLICE_NAME}-1": 1,
        "TPU": 8, "CPU": 18, "memory": 42e9,
    }  # fmt: skip
    pod.check_local_cluster(two_slices, local_slice(1), num_slices=2)
    one_slice_of_two = {
        "TPU-cpu-head": 1, "TPU-v4-16-head": 1, LOCAL_SLICE_NAME: 2, "TPU": 8, "CPU": 18, "memory": 42e9,
    }  # fmt: skip
    with pytest.raises(LaunchError) as error:  # as many nodes, but one slice: Levanter would wait for the second
        pod.check_local_cluster(one_slice_of_two, local_slice(1), num_slices=2)
    assert f"'{LOCAL_SLICE_NAME}-1': 1" in str(error.value) and "--num_hosts 1 --num_slices 2" in str(error.value)


def test_a_host_of_a_multi_slice_local_pod_is_process_slice_times_hosts_plus_worker(monkeypatch):
    assert [host.process_id(s, w, 2) for s in range(2) for w in range(2)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        host.process_id(0, 2, 2)
    asked = []
    monkeypatch.setattr(rendezvous, "coordinator_port", lambda name, process: asked.append((name, process)) or 41235)
    local = host.LocalHost(num_hosts=2, devices_per_host=2, rendezvous="r-2", num_slices=2)
    megascale = {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"}  # what run_on_pod sets for slice 1
    flags, _ = host.local_host_setup(local, {"TPU_WORKER_ID": "1", **megascale})
    assert asked == [("r-2", 3)]
    assert flags[flags.index("--trainer.distributed.num_processes") + 1] == "4"
    assert flags[flags.index("--trainer.distributed.process_id") + 1] == "3"
    with pytest.raises(RuntimeError, match="MEGASCALE_SLICE_ID"):  # a task without its slice cannot be placed
        host.local_host_setup(local, {"TPU_WORKER_ID": "1"})
    # Two one-host slices still meet at a coordinator, and the training process keeps the MEGASCALE_* variables.
    flags, _ = host.local_host_setup(host.LocalHost(1, 2, "r-3", num_slices=2), {"TPU_WORKER_ID": "0", **megascale})
    assert flags[flags.index("--trainer.distributed.process_id") + 1] == "1"
    env = host.training_environment({"TPU_NAME": "x", **megascale}, {}, local=True)
    assert env == megascale


def test_multi_slice_local_pod_dry_run_plans_every_slice(capsys, monkeypatch, tmp_path, pydocs_corpus):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tiny_config(tmp_path, pydocs_corpus, "pod-slices-dry")
    argv = ["--config_path", str(config), "--tpu_type", "cpu", "--num_slices", "2", "--num_hosts", "2",
            "--devices_per_host", "1", "--", "--trainer.replica_dcn_axis_size", "-1"]  # fmt: skip
    plan, _, _ = dry_run(capsys, *argv)
    assert plan["slices"] == 2 and plan["hosts"] == {"per_slice": 2, "total": 4}
    assert plan["mesh"]["dcn_across_slices"] == {"replica": 2, "data": 1, "model": 1}
    assert plan["resources"]["total"]["TPU-cpu-head"] == 2
    per_host = plan["local_pod"]["per_host"]
    assert per_host["MEGASCALE_NUM_SLICES"] == "2"
    flags = per_host["training_flags"]
    assert flags[flags.index("--trainer.distributed.num_processes") + 1] == "4"
    assert flags[flags.index("--trainer.distributed.process_id") + 1] == "<slice> * 2 + <host: 0..1>"
    entry = shlex.split(plan["ray_job"]["entrypoint"])
    assert entry[entry.index("--num_slices") + 1] == "2"
