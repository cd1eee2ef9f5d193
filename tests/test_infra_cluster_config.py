"""infra/cluster.yaml against Ray's own autoscaler schema and checks, and against Levanter's slice table; the
Docker image's pins; the per-host requests we assume of Levanter's scheduler."""

import copy
import importlib.metadata
import inspect
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest
import ray
import ray.autoscaler
import yaml
from levanter.infra import ray_tpu
from packaging.requirements import Requirement
from ray._private.accelerators.tpu import TPUAcceleratorManager
from ray.autoscaler._private.util import prepare_config, validate_config

from levanter_mars.infra.slices import (
    HOST_TASK_CPUS,
    HOST_TASK_MEMORY_BYTES,
    RUNTIME_VERSIONS,
    head_resource,
    slice_type,
)

REPO = Path(__file__).resolve().parents[1]
CLUSTER = yaml.safe_load((REPO / "infra" / "cluster.yaml").read_text())
REQUIRED_TYPES = {"v4-8", "v4-32", "v5litepod-16", "v5p-8", "v6e-8"}


def worker_types():
    return {name: node for name, node in CLUSTER["available_node_types"].items() if name != CLUSTER["head_node_type"]}


def tpu_types():
    return sorted(node["node_config"]["acceleratorType"] for node in worker_types().values())


def test_cluster_config_validates_against_rays_autoscaler_schema():
    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(CLUSTER, schema)
    # What `ray up` does before it contacts GCP: fill in Ray's GCP defaults, then validate the result.
    validate_config(prepare_config(copy.deepcopy(CLUSTER)))


def test_schema_validation_would_catch_a_broken_config():
    broken = copy.deepcopy(CLUSTER)
    broken["available_node_types"]["tpu_v4_32"]["resources"]["TPU"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_the_required_slice_types_are_offered():
    assert REQUIRED_TYPES <= set(tpu_types())


@pytest.mark.parametrize("name", sorted(worker_types()))
def test_worker_type_matches_levanters_slice_table_and_rays_tpu_checks(name):
    node = worker_types()[name]
    config = node["node_config"]
    tpu_type = config["acceleratorType"]
    kind = slice_type(tpu_type)  # Levanter's TPU_CONFIGS: unknown types raise
    # Ray's GCP provider treats a node config as a TPU when it has acceleratorType and no machineType, and checks
    # the type with this (ray.autoscaler._private.gcp.config, which needs Google's API client to import).
    assert TPUAcceleratorManager.is_valid_tpu_accelerator_type(tpu_type)
    assert "machineType" not in config
    assert config["runtimeVersion"] == RUNTIME_VERSIONS[kind.generation]
    assert config["schedulingConfig"]["preemptible"] is True
    resources = node["resources"]
    # One slice = one head resource: what a job asks for to make the autoscaler start a slice of this type.
    assert resources[head_resource(tpu_type)] == 1
    assert [k for k in resources if k.endswith("-head")] == [head_resource(tpu_type)]
    # Per host: all its chips and at least the CPUs Levanter's host task asks for.
    assert resources["TPU"] == kind.chips_per_host
    assert resources["CPU"] >= HOST_TASK_CPUS


def test_head_is_an_ordinary_vm_that_can_host_the_slice_scheduler():
    head = CLUSTER["available_node_types"][CLUSTER["head_node_type"]]
    assert "machineType" in head["node_config"] and "acceleratorType" not in head["node_config"]
    assert head["max_workers"] == 0
    assert head["resources"]["CPU"] >= 1  # run_on_pod's coordinator task (0.01 CPU) and the job drivers
    assert not any(k.startswith("TPU") for k in head["resources"])


def test_dashboard_listens_on_loopback_only():
    head_start = " ".join(CLUSTER["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start


def test_levanters_host_task_asks_for_what_we_provision():
    """Levanter's TPUHostActor hard-codes what each host task asks Ray for; the cluster types, the local engine's
    `ray start` and the dry-run resource report all assume these numbers."""
    source = inspect.getsource(ray_tpu)
    block = source[source.index("self._awaitable = remote_fn.options(") :]
    block = block[: block.index(").remote()")]
    assert f"num_cpus={HOST_TASK_CPUS}," in block, block
    assert float(re.search(r"memory=([0-9.e]+)", block).group(1)) == HOST_TASK_MEMORY_BYTES, block
    assert '"TPU": self._host_info.num_tpus' in block, block


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def test_docker_image_installs_the_pinned_stack_with_jax_tpu():
    dockerfile = (REPO / "infra" / "Dockerfile").read_text()
    install = next(line for line in dockerfile.splitlines() if "pip install" in line)
    assert "-c constraints.txt" in install and '"jax[tpu]"' in install and '".[train]"' in install
    pins = _pins(REPO / "constraints.txt")
    assert pins["jax"] == pins["jaxlib"]
    # The image refuses to build with any other jax than the lock's.
    assert f"assert jax.__version__ == '{pins['jax']}'" in dockerfile
    # The launcher's Ray speaks to the cluster's: the image must install the same version as this environment.
    assert pins["ray"] == ray.__version__
    assert pins["levanter"] == importlib.metadata.version("levanter")
    # jax's `tpu` extra pins libtpu (0.7: exactly, 0.9: `libtpu==0.0.37.*`); the lock holds a libtpu it accepts
    # (pre-flight compiles with it on CPU machines), so the image and pre-flight use one tested TPU compiler.
    assert importlib.metadata.version("jax") == pins["jax"], "the installed jax is not the lock's"
    tpu_requirements = [Requirement(r) for r in importlib.metadata.requires("jax") if 'extra == "tpu"' in r]
    declared = [r.specifier for r in tpu_requirements if r.name == "libtpu"]
    assert len(declared) == 1 and declared[0].contains(pins["libtpu"]), tpu_requirements
    assert any(r.name == "jaxlib" and r.specifier.contains(pins["jaxlib"]) for r in tpu_requirements), tpu_requirements
    # The base image's Python is the one pyproject.toml requires.
    base = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.M).group(1)
    assert f"<{base.split('.')[0]}.{int(base.split('.')[1]) + 1}" in (REPO / "pyproject.toml").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (REPO / path).exists(), path


def test_cluster_nodes_run_the_image_the_readme_tells_you_to_push():
    readme = (REPO / "infra" / "README.md").read_text()
    image = CLUSTER["docker"]["image"]
    assert f"IMAGE={image}" in readme
    assert "YOUR-PROJECT" in image and "YOUR-PROJECT" in CLUSTER["provider"]["project_id"]
