"""The Ray launcher without a cluster: dry runs for every slice type of infra/cluster.yaml and for multi-slice
meshes, credentials handling, bad input, and the pieces of the job that run on the cluster."""

import itertools
import json
import os
import re
import shlex
import socket
import sys
from pathlib import Path

import pytest
import yaml

from levanter_mars.infra import host, launch, pod
from levanter_mars.infra.config import SECRET_METADATA_PREFIX, LaunchError, RayLaunchConfig, parse_args
from levanter_mars.infra.local_cluster import ray_start_args
from levanter_mars.infra.local_node import NODE_ENVIRONMENT
from levanter_mars.infra.plan import prepare
from levanter_mars.infra.ray_job import LOCAL_WORKER_HOOK, build_job
from levanter_mars.infra.slices import head_resource, slice_type
from tests.helpers.ray_launch import ContactError, contact_nothing, dry_run  # noqa: F401 - an autouse fixture
from tests.helpers.training import tiny_config

REPO = Path(__file__).resolve().parents[1]
CLUSTER = yaml.safe_load((REPO / "infra" / "cluster.yaml").read_text())
CLUSTER_TPU_TYPES = sorted(
    node["node_config"]["acceleratorType"]
    for name, node in CLUSTER["available_node_types"].items()
    if name != CLUSTER["head_node_type"]
)
SMALL = "config/gpt2_small_mars.yaml"
TINY = "config/gpt2_tiny_mars.yaml"
BUCKET = ["--trainer.checkpointer.base_path", "gs://test-bucket/ckpt", "--data.cache_dir", "gs://test-bucket/tok"]


def test_the_guard_catches_contact():
    with pytest.raises(ContactError):
        socket.create_connection(("127.0.0.1", 9))


@pytest.mark.parametrize("tpu_type", CLUSTER_TPU_TYPES)
def test_dry_run_for_every_slice_type_of_the_cluster(capsys, tpu_type):
    plan, config, _ = dry_run(capsys, "--config_path", SMALL, "--tpu_type", tpu_type, "--", *BUCKET)
    kind = slice_type(tpu_type)
    assert plan["tpu_type"] == tpu_type and plan["slices"] == 1 and plan["run_id"] == "gpt2-small-mars"
    assert plan["hosts"] == {"per_slice": kind.hosts, "total": kind.hosts}
    resources = plan["resources"]
    assert resources["per_slice"] == {head_resource(tpu_type): 1}
    assert resources["per_host"]["TPU"] == kind.chips_per_host
    assert resources["total"]["TPU"] == kind.devices  # every chip of the slice, one host task each
    assert plan["mesh"]["devices"] == kind.devices
    assert plan["mesh"]["mesh_axes"] == {"replica": 1, "data": kind.devices, "model": 1}
    batch = plan["mesh"]["batch"]
    assert batch["examples_per_device_per_microbatch"] == 30  # the config's per_device_parallelism
    assert batch["microbatches_per_step"] * 30 * kind.devices == 480
    job = plan["ray_job"]
    assert job["entrypoint"].startswith(f"python -m levanter_mars.infra.pod --tpu_type {tpu_type} --num_slices 1")
    assert job["entrypoint"].endswith(f"-- --config_path {SMALL} {' '.join(BUCKET)} --trainer.id gpt2-small-mars")
    env = job["runtime_env"]
    assert env["working_dir"] == "." and ".venv" in env["excludes"] and ".git" in env["excludes"]
    assert env["env_vars"] == {"RUN_ID": "gpt2-small-mars", "PYTHONPATH": "src"}
    # The resolved training config follows, with the overrides applied.
    assert config["trainer"]["checkpointer"]["base_path"] == "gs://test-bucket/ckpt"
    assert config["trainer"]["id"] == "gpt2-small-mars" and config["optimizer"]["type"] == "mars-adamw"


def test_dry_run_v4_32_two_slices_replicates_across_dcn_and_shards_within_slices(capsys):
    plan, _, _ = dry_run(
        capsys, "--config_path", SMALL, "--tpu_type", "v4-32", "--num_slices", "2", "--",
        *BUCKET, "--trainer.replica_dcn_axis_size", "-1", "--trainer.per_device_parallelism", "15",
    )  # fmt: skip
    assert plan["hosts"] == {"per_slice": 4, "total": 8}
    assert plan["resources"]["total"] == {
        "TPU-v4-32-head": 2, "TPU": 32, "CPU": 64, "memory": 160 * 10**9,
    }  # fmt: skip
    mesh = plan["mesh"]
    assert (mesh["devices"], mesh["slices"], mesh["devices_per_slice"]) == (32, 2, 16)
    assert mesh["mesh_axes"] == {"replica": 2, "data": 16, "model": 1}
    assert mesh["ici_per_slice"] == {"replica": 1, "data": 16, "model": 1}
    assert mesh["dcn_across_slices"] == {"replica": 2, "data": 1, "model": 1}
    assert mesh["batch"]["examples_per_device_per_microbatch"] == 15
    assert mesh["batch"]["microbatches_per_step"] == 1
    assert mesh["warnings"] == []
    assert "--num_slices 2" in plan["ray_job"]["entrypoint"]


def test_fsdp_across_slices_is_shown_and_warned_about(capsys):
    plan, _, _ = dry_run(
        capsys, "--config_path", SMALL, "--tpu_type", "v4-32", "--num_slices", "2", "--",
        *BUCKET, "--trainer.per_device_parallelism", "15",
    )  # fmt: skip
    mesh = plan["mesh"]
    assert mesh["mesh_axes"] == {"replica": 1, "data": 32, "model": 1}
    assert mesh["dcn_across_slices"] == {"replica": 1, "data": 2, "model": 1}
    assert any("replica_dcn_axis_size=-1" in w for w in mesh["warnings"])


def test_tensor_parallel_mesh_on_one_host(capsys):
    plan, _, _ = dry_run(
        capsys, "--config_path", SMALL, "--tpu_type", "v6e-8", "--",
        *BUCKET, "--trainer.model_axis_size", "4", "--trainer.tensor_parallel_axes", "[mlp, heads]",
    )  # fmt: skip
    assert plan["mesh"]["mesh_axes"] == {"replica": 1, "data": 2, "model": 4}
    assert plan["mesh"]["batch"]["microbatches_per_step"] == 8  # 480 / (30 x 2)


def test_local_engine_job_runs_this_checkout_in_place(capsys, tmp_path, pydocs_corpus):
    config = tiny_config(tmp_path, pydocs_corpus, "local-dry")
    plan, resolved, _ = dry_run(capsys, "--config_path", str(config), "--tpu_type", "cpu", "--retries", "2")
    assert plan["resources"]["per_slice"] == {"TPU-cpu-head": 1}
    assert plan["mesh"]["devices"] == 1
    assert plan["retries"] == {"failure": 2, "preemption": 100}
    job = plan["ray_job"]
    entry = shlex.split(job["entrypoint"])
    assert entry[:3] == [sys.executable, "-m", "levanter_mars.infra.pod"]  # same interpreter, same machine
    assert entry[entry.index("--workdir") + 1] == str(REPO)  # runs here: relative paths land here
    env = job["runtime_env"]
    assert "working_dir" not in env  # nothing shipped
    assert env["worker_process_setup_hook"] == LOCAL_WORKER_HOOK
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO / "src")
    assert resolved["trainer"]["id"] == "local-dry"


def test_credentials_travel_in_job_metadata_and_are_never_printed(capsys, monkeypatch):
    secrets = {"WANDB_API_KEY": "wandb-Zq81xT0p", "HF_TOKEN": "hf_Kd72LmQa"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    argv = ["--config_path", SMALL, "--tpu_type", "v4-8", "--", *BUCKET]
    plan, _, out = dry_run(capsys, *argv)
    for value in secrets.values():
        assert value not in out
    assert set(plan["secrets_forwarded"]) == set(secrets)
    assert plan["secrets_not_set"] == ["HUGGING_FACE_HUB_TOKEN"]
    assert set(plan["ray_job"]["metadata"]) == {"launcher", "run_id", *(SECRET_METADATA_PREFIX + n for n in secrets)}

    config, overrides = parse_args(["--dry_run", *argv], RayLaunchConfig)  # a real launch would probe the bucket
    job = build_job(prepare(config, overrides), config)
    assert {k: v for k, v in job.metadata.items() if k.startswith(SECRET_METADATA_PREFIX)} == {
        SECRET_METADATA_PREFIX + k: v for k, v in secrets.items()
    }
    # Not in the runtime environment (Ray logs it) nor the entrypoint (Ray logs that too): only their names.
    shown = json.dumps({"entrypoint": job.entrypoint, "runtime_env": job.runtime_env, "printable": job.printable()})
    for value in secrets.values():
        assert value not in shown
    assert "--secrets HF_TOKEN,WANDB_API_KEY" in job.entrypoint_command


def test_run_id_flag_pins_every_attempt(capsys):
    plan, config, _ = dry_run(
        capsys, "--config_path", SMALL, "--tpu_type", "v4-8", "--run_id", "small-try2", "--", *BUCKET
    )
    assert plan["run_id"] == config["trainer"]["id"] == "small-try2"
    assert plan["ray_job"]["runtime_env"]["env_vars"]["RUN_ID"] == "small-try2"
    assert plan["ray_job"]["entrypoint"].endswith("--trainer.id small-try2")


def documented_launches():
    """The launch commands in the header comments of the shipped configs."""
    found = []
    for path in sorted((REPO / "config").glob("*.yaml")):
        lines = path.read_text().splitlines()
        header = "\n".join(line[1:].strip() for line in itertools.takewhile(lambda text: text.startswith("#"), lines))
        for match in re.finditer(r"python -m levanter_mars\.infra\.launch (.+)", header.replace("\\\n", " ")):
            found.append(pytest.param(shlex.split(match.group(1)), id=f"{path.stem}-{len(found)}"))
    return found


@pytest.mark.parametrize("argv", documented_launches())
def test_every_launch_command_documented_in_a_config_dry_runs(capsys, argv):
    own = argv[: argv.index("--")] if "--" in argv else argv
    overrides = argv[len(own) + 1 :]
    plan, _, _ = dry_run(capsys, *own, "--", *BUCKET, *overrides)
    slices = int(own[own.index("--num_slices") + 1]) if "--num_slices" in own else 1
    assert plan["mesh"]["devices"] == slices * slice_type(plan["tpu_type"]).devices
    assert plan["mesh"]["warnings"] == []
    if slices > 1:
        assert plan["mesh"]["dcn_across_slices"]["replica"] == slices


def test_the_configs_document_single_and_multi_slice_launches():
    launches = [p.values[0] for p in documented_launches()]
    multi_slice = {os.path.basename(a[a.index("--config_path") + 1]) for a in launches if "--num_slices" in a}
    single_slice = {os.path.basename(a[a.index("--config_path") + 1]) for a in launches if "--num_slices" not in a}
    paper_recipes = {f"gpt2_{size}_{kind}.yaml" for size in ("small", "medium", "large", "xl") for kind in ("mars", "mars_m")}
    assert paper_recipes <= multi_slice and paper_recipes <= single_slice, (multi_slice, single_slice)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config_path", SMALL, "--tpu_type", "v9-8", "--", *BUCKET], "--tpu_type: unknown slice type 'v9-8'"),
        (["--config_path", SMALL, "--tpu_type", "v4-8"], "YOUR-BUCKET"),
        (
            [
                "--config_path",
                SMALL,
                "--tpu_type",
                "v4-8",
                "--",
                *BUCKET[2:],
                "--trainer.checkpointer.base_path",
                "/tmp/c",
            ],
            "trainer.checkpointer.base_path='/tmp/c' is local",
        ),
        (
            ["--config_path", TINY, "--tpu_type", "cpu", "--num_slices", "3", "--num_hosts", "4"],
            "--num_slices 3 x --num_hosts 4: the local pod starts one Ray node per host on this machine, at most 8",
        ),
        (["--config_path", TINY, "--tpu_type", "cpu", "--num_slices", "0"], "--num_slices must be >= 1, got 0"),
        (
            [
                "--config_path",
                SMALL,
                "--tpu_type",
                "v4-32",
                "--num_slices",
                "2",
                "--",
                *BUCKET,
                "--trainer.replica_dcn_axis_size",
                "3",
            ],
            "trainer.replica_dcn_axis_size=3 must divide --num_slices=2",
        ),
        (
            ["--config_path", SMALL, "--tpu_type", "v4-32", "--", *BUCKET, "--trainer.model_axis_size", "3"],
            "trainer.model_axis_size=3 must divide the 16 devices",
        ),
        (
            ["--config_path", SMALL, "--tpu_type", "v4-32", "--num_slices", "2", "--", *BUCKET],
            "trainer.train_batch_size=480 is not divisible by trainer.per_device_parallelism=30",
        ),
        (["--config_path", "/etc/hostname", "--tpu_type", "v4-8"], "--config_path '/etc/hostname' is outside"),
        (["--config_path", "config/nope.yaml", "--tpu_type", "cpu"], "--config_path: no such file"),
        (["--tpu_type", "v4-8"], "--config_path is required"),
        (["--config_path", "config/gpt2_tiny_mars.yaml", "--tpu_type", "cpu", "--num_hosts", "3"], "--num_hosts 3"),
        (
            ["--config_path", "config/gpt2_tiny_mars.yaml", "--tpu_type", "cpu", "--devices_per_host", "0"],
            "--devices_per_host must be >= 1",
        ),
        (
            ["--config_path", SMALL, "--tpu_type", "v4-8", "--num_hosts", "2", "--", *BUCKET],
            "--num_hosts and --devices_per_host are for --tpu_type cpu",
        ),
        (["--config_path", SMALL, "--tpu_type", "v4-8", "--retries", "-1"], "--retries must be >= 0"),
    ],
)
def test_bad_input_is_refused_naming_the_flag_or_field(capsys, argv, message):
    assert launch.cli(["--dry_run", *argv]) == 2
    out, err = capsys.readouterr()
    assert message in err, err
    assert out == ""


def test_readme_local_ray_start_is_the_one_the_engine_checks_for():
    readme = (REPO / "infra" / "README.md").read_text()
    block = re.search(r"^export RAY_ENABLE.*?--disable-usage-stats$", readme, re.S | re.M).group(0)
    export_line, token_line, command = block.split("\n", 2)
    assert shlex.split(export_line) == ["export", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0", "RAY_AUTH_MODE=token"]
    assert shlex.split(token_line, comments=True) == ["ray", "get-auth-token", "--generate", ">/dev/null"]
    tokens = shlex.split(command.replace("\\\n", " "))
    env = dict(t.split("=", 1) for t in tokens[: tokens.index("ray")])
    assert env == NODE_ENVIRONMENT
    assert tokens[tokens.index("ray") :] == ray_start_args()


def test_driver_takes_credentials_out_of_its_job_config():
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    metadata = {"job_submission_id": "x", SECRET_METADATA_PREFIX + "WANDB_API_KEY": "w-123"}
    environ = {RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps({"runtime_env": {}, "metadata": metadata})}
    assert pod.take_secrets(["WANDB_API_KEY"], environ) == {"WANDB_API_KEY": "w-123"}
    assert "w-123" not in environ[RAY_JOB_CONFIG_JSON_ENV_VAR]  # what ray.init will register with the cluster
    assert json.loads(environ[RAY_JOB_CONFIG_JSON_ENV_VAR])["metadata"] == {"job_submission_id": "x"}
    with pytest.raises(LaunchError, match="HF_TOKEN"):
        pod.take_secrets(["HF_TOKEN"], environ)


def test_training_environment_gets_credentials_and_drops_the_local_node_environment():
    environ = {"PATH": "/bin", **NODE_ENVIRONMENT, "TPU_VISIBLE_CHIPS": "0,1,2,3"}
    local = host.training_environment(environ, {"WANDB_API_KEY": "w"}, local=True)
    assert local == {"PATH": "/bin", "WANDB_API_KEY": "w"}
    users_own_proxy = host.training_environment({"http_proxy": "http://proxy.corp:3128"}, {}, local=True)
    assert users_own_proxy == {"http_proxy": "http://proxy.corp:3128"}
    on_tpu = host.training_environment(environ, {"WANDB_API_KEY": "w"}, local=False)
    assert on_tpu["TPU_VISIBLE_CHIPS"] == "0,1,2,3" and on_tpu["WANDB_API_KEY"] == "w"


def test_the_launcher_runs_the_training_programs_own_validation(capsys, tmp_path, pydocs_corpus, monkeypatch):
    """A training file that does not exist stops the launch, dry run included, before anything is submitted: on
    4cb100e the launcher ran a hand-picked part of the validation, without the data checks, and passed it."""
    data = {"train_urls": [str(tmp_path / "missing.jsonl")], "cache_dir": str(tmp_path / "tokenized")}
    config = tiny_config(tmp_path, pydocs_corpus, "no-data", {"data": data})
    assert launch.cli(["--dry_run", "--config_path", str(config), "--tpu_type", "cpu", "--num_hosts", "2"]) == 2
    out, err = capsys.readouterr()
    assert f"config error: data.train_urls[0]: no such file {str(tmp_path / 'missing.jsonl')!r}" in err and not out

    # A dry run contacts nothing and writes nothing: it says what it did not check. (The run's compilation cache
    # defaults to beside its checkpoints where no $JAX_COMPILATION_CACHE_DIR is set, as on a pod; the suite sets one.)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    plan, _, _ = dry_run(capsys, "--config_path", SMALL, "--tpu_type", "v4-8", "--", *BUCKET)
    skipped = plan["validation"]["not checked here"]
    assert "trainer.checkpointer.base_path 'gs://test-bucket/ckpt/gpt2-small-mars' (a write probe)" in skipped
    cache = "gs://test-bucket/ckpt/compile-cache"
    assert any(s.startswith("trainer.compilation_cache") and cache in s for s in skipped), skipped


@pytest.mark.parametrize("stop_job, expected", [(True, ["stop"]), (False, [])])
def test_an_interrupted_launch_stops_its_job_only_when_asked(monkeypatch, capsys, stop_job, expected):
    """compare launches with --stop_job_on_interrupt true: its stop (SIGTERM) must not leave the run training on the
    pod; a person's Ctrl-C of a plain launch leaves the job going, as before. The job API is replaced here."""
    import signal as signals

    from levanter_mars.infra import launch as launcher
    from levanter_mars.infra import ray_job
    from levanter_mars.infra.config import RayLaunchConfig

    calls = []

    def follow(submission, address):
        launcher._interrupt(signals.SIGTERM, None)  # the SIGTERM arriving while the log streams

    monkeypatch.setattr(ray_job, "submit", lambda job, address: "raysubmit_1")
    monkeypatch.setattr(ray_job, "follow", follow)
    monkeypatch.setattr(ray_job, "stop", lambda submission, address: calls.append("stop") or "STOPPED")
    launch = RayLaunchConfig(tpu_type="v4-32", train_config="x.yaml", stop_job_on_interrupt=stop_job)
    code = launcher.run_job(object(), "http://127.0.0.1:8265", launch, "v4-32")
    assert code == 128 + signals.SIGTERM and calls == expected
    err = capsys.readouterr().err
    assert ("stopping Ray job raysubmit_1" in err) == stop_job and ("the job goes on" in err) != stop_job


def test_a_comparison_launches_its_pod_runs_to_be_stopped_with_it():
    from levanter_mars.compare.execute import training_command
    from levanter_mars.compare.spec import CompareConfig

    spec = CompareConfig(name="c", base="b.yaml", tpu_type="v4-32")
    command = training_command(spec, "runs/compare/c/configs/r.yaml", [])
    assert command[command.index("--stop_job_on_interrupt") + 1] == "true"
