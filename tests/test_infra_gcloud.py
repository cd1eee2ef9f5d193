"""The plain-gcloud path: its dry run (the exact commands) and its retry loop against a scripted gcloud."""

import io
import shlex
import subprocess
from pathlib import Path

import pytest

from levanter_mars.infra import gcloud
from levanter_mars.infra.config import parse_args
from levanter_mars.infra.plan import prepare

REPO = Path(__file__).resolve().parents[1]
IMAGE = "us-central2-docker.pkg.dev/proj/levanter-mars/levanter-mars:v1"
BASE = [
    "--config_path",
    "config/gpt2_small_mars.yaml",
    "--project",
    "proj",
    "--zone",
    "us-central2-b",
    "--image",
    IMAGE,
]
BUCKET = ["--trainer.checkpointer.base_path", "gs://b/ckpt", "--data.cache_dir", "gs://b/tok"]
SECRET = "wandb-3JqP0zXv"


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)


def plan_for(*flags, overrides=BUCKET):
    launch, extra = parse_args([*BASE, *flags, "--", *overrides], gcloud.GcloudLaunchConfig)
    gcloud.check(launch)
    # Prepared as a dry run: a real launch also probes the bucket and loads the hub tokenizer, not these tests' topic.
    dry = parse_args([*BASE, *flags, "--dry_run", "--", *overrides], gcloud.GcloudLaunchConfig)[0]
    return gcloud.GcloudPlan(prepare(dry, extra), launch)


def commands(rendered: str) -> list[list[str]]:
    return [shlex.split(line) for line in rendered.splitlines() if line.startswith("gcloud ")]


def test_dry_run_prints_the_exact_commands_and_no_credentials(capsys):
    multi_slice = ["--trainer.replica_dcn_axis_size", "-1", "--trainer.per_device_parallelism", "15"]
    assert (
        gcloud.cli([*BASE, "--tpu_type", "v4-32", "--num_slices", "2", "--dry_run", "--", *BUCKET, *multi_slice]) == 0
    )
    out = capsys.readouterr().out
    assert SECRET not in out
    section = out.split("# commands, in order\n")[1].split("\n---\n")[0]
    cmds = commands(section)
    create = cmds[0]
    assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "lm-gpt2-small-mars"]
    expected = {
        "--accelerator-type": "v4-32",
        "--runtime-version": "tpu-ubuntu2204-base",
        "--node-count": "2",
        "--node-prefix": "lm-gpt2-small-mars",
        "--zone": "us-central2-b",
    }
    assert {flag: create[create.index(flag) + 1] for flag in expected} == expected
    assert "--spot" in create
    ssh = [c for c in cmds if c[3:5] == ["tpu-vm", "ssh"]]
    setup = [c for c in ssh if "--worker=all" in c]
    train = [c for c in ssh if "--worker=all" not in c]
    assert [c[5] for c in setup] == ["lm-gpt2-small-mars-0", "lm-gpt2-small-mars-1"]
    assert sorted((c[5], c[c.index("--zone") + 2]) for c in train) == sorted(
        (f"lm-gpt2-small-mars-{s}", f"--worker={w}") for s in range(2) for w in range(4)
    )
    remote = train[0][train[0].index("--command") + 1]
    assert "--env-file /dev/stdin" in remote and "--privileged" in remote and IMAGE in remote
    assert remote.endswith("--trainer.id gpt2-small-mars")
    assert out.count("stdin: WANDB_API_KEY=") == 8
    assert cmds[-1][3:5] == ["queued-resources", "delete"]
    assert "mesh_axes:\n    replica: 2\n    data: 16" in out


def test_single_slice_uses_a_node_id_and_the_generation_runtime():
    create = plan_for("--tpu_type", "v6e-8", "--capacity", "on-demand").create().argv
    assert create[create.index("--node-id") + 1] == "lm-gpt2-small-mars"
    assert create[create.index("--runtime-version") + 1] == "v2-alpha-tpuv6e"
    assert "--spot" not in create and "--node-count" not in create


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tpu_type", "v4-8", "--capacity", "cheap"], "--capacity must be one of"),
        (["--tpu_type", "cpu"], "local Ray engine"),
    ],
)
def test_bad_flags(capsys, flags, message):
    assert gcloud.cli([*BASE, *flags, "--dry_run", "--", *BUCKET]) == 2
    assert message in capsys.readouterr().err


class ScriptedGcloud:
    """Stands in for subprocess.Popen: answers `describe` from a state, runs `train` steps from a script of exit
    codes (one attempt per list), and records every call and what came through stdin."""

    def __init__(self, attempts, preempt_on_attempt=None):
        self.state = "NOT_FOUND"
        self.attempts = list(attempts)
        self.preempt_on_attempt = preempt_on_attempt
        self.calls: list[list[str]] = []
        self.stdin_seen: list[bytes] = []
        self.creates = 0
        self._attempt = 0
        self._hosts_started = 0

    def __call__(self, argv, stdin=None, stdout=None, text=None):
        self.calls.append(argv)
        code, output = 0, ""
        if argv[3:5] == ["queued-resources", "create"]:
            self.creates += 1
            self.state = "ACTIVE"
        elif argv[3:5] == ["queued-resources", "describe"]:
            output = self.state if self.state != "NOT_FOUND" else ""
            code = 0 if self.state != "NOT_FOUND" else 1
        elif argv[3:5] == ["queued-resources", "delete"]:
            self.state = "NOT_FOUND"
        elif argv[3:5] == ["tpu-vm", "ssh"] and "--worker=all" not in argv:
            codes = self.attempts[self._attempt]
            code = codes[self._hosts_started % len(codes)]
            self._hosts_started += 1
            if self._hosts_started % len(codes) == 0:
                if self.preempt_on_attempt == self._attempt:
                    self.state = "SUSPENDED"
                self._attempt += 1
        return _FakeProc(code, output, self.stdin_seen if stdin == subprocess.PIPE else None)


class _FakeProc:
    def __init__(self, code, output, sink):
        self.returncode, self._output = code, output
        self.stdin = _Sink(sink) if sink is not None else None

    def communicate(self):
        return self._output, None

    def wait(self):
        return self.returncode


class _Sink(io.BytesIO):
    def __init__(self, sink):
        super().__init__()
        self._sink = sink

    def close(self):
        self._sink.append(self.getvalue())
        super().close()


def run_scripted(plan, fake):
    out = io.StringIO()
    code = gcloud.GcloudRunner(plan, spawn=fake, sleep=lambda s: None, out=out).run()
    return code, out.getvalue()


def test_failure_reruns_on_the_same_slice_and_credentials_go_through_stdin_only():
    plan = plan_for("--tpu_type", "v4-32", "--retries", "1")
    fake = ScriptedGcloud(attempts=[[0, 1, 0, 0], [0, 0, 0, 0]])
    code, log = run_scripted(plan, fake)
    assert code == 0, log
    assert fake.creates == 1, "a failure does not re-create the slice"
    train_calls = [c for c in fake.calls if c[3:5] == ["tpu-vm", "ssh"] and "--worker=all" not in c]
    assert len(train_calls) == 8  # 4 hosts x 2 attempts
    assert fake.stdin_seen == [f"WANDB_API_KEY={SECRET}\n".encode()] * 8
    assert not any(SECRET in arg for call in fake.calls for arg in call)
    assert SECRET not in log and "retried (failure 1 of 1)" in log
    assert fake.calls[-1][3:5] == ["queued-resources", "delete"]


def test_preemption_recreates_the_slice_and_is_counted_separately():
    plan = plan_for("--tpu_type", "v4-8", "--retries", "0", "--preemption_retries", "1")
    fake = ScriptedGcloud(attempts=[[255], [0]], preempt_on_attempt=0)
    code, log = run_scripted(plan, fake)
    assert code == 0, log
    assert fake.creates == 2 and "a host was lost" in log and "retried (preemption 1 of 1)" in log
    deletes = [c for c in fake.calls if c[3:5] == ["queued-resources", "delete"]]
    assert len(deletes) == 2  # the suspended slice, then the finished one


def test_out_of_retries_fails_and_still_deletes_the_slice():
    plan = plan_for("--tpu_type", "v4-8", "--retries", "1")
    fake = ScriptedGcloud(attempts=[[1], [1], [0]])
    code, log = run_scripted(plan, fake)
    assert code == 1 and "the failure retries are spent (1 of 1)" in log
    assert fake.calls[-1][3:5] == ["queued-resources", "delete"]


def test_keep_leaves_the_slice_up():
    plan = plan_for("--tpu_type", "v4-8", "--keep")
    fake = ScriptedGcloud(attempts=[[0]])
    assert run_scripted(plan, fake)[0] == 0
    assert not any(c[3:5] == ["queued-resources", "delete"] for c in fake.calls)
    assert "delete" not in plan.render()


def test_a_config_error_is_not_retried_and_every_attempt_is_one_launch():
    """Exit 2 (a bad config) cannot succeed on a retry: the launch ends at once with it. Every attempt runs with the
    same launch id, which makes fresh=true a once-per-launch action (tests/test_pod_workflow.py)."""
    from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV

    plan = plan_for("--tpu_type", "v4-8", "--retries", "3")
    fake = ScriptedGcloud(attempts=[[2], [0]])
    code, log = run_scripted(plan, fake)
    assert code == 2 and "config error" in log and "not retried" in log, log
    train_calls = [c for c in fake.calls if c[3:5] == ["tpu-vm", "ssh"] and "--worker=all" not in c]
    assert len(train_calls) == 1, "a config error was retried"
    assert fake.calls[-1][3:5] == ["queued-resources", "delete"]
    # Any stop the run decides ends the launch the same way, with its own code (here a non-finite stop).
    code, log = run_scripted(plan_for("--tpu_type", "v4-8", "--retries", "3"), ScriptedGcloud(attempts=[[3], [0]]))
    assert code == 3 and "exit 3 (nonfinite stop)" in log and "not retried" in log, log

    plan = plan_for("--tpu_type", "v4-8", "--retries", "1")
    fake = ScriptedGcloud(attempts=[[1], [0]])
    assert run_scripted(plan, fake)[0] == 0
    trains = [c for c in fake.calls if c[3:5] == ["tpu-vm", "ssh"] and "--worker=all" not in c]
    remotes = [c[c.index("--command") + 1] for c in trains]
    launch_ids = [arg for r in remotes for arg in shlex.split(r) if arg.startswith(f"{LAUNCH_ID_ENV}=")]
    assert len(remotes) == 2 and len(launch_ids) == 2 and len(set(launch_ids)) == 1, remotes
    assert launch_ids[0] == f"{LAUNCH_ID_ENV}={plan.launch_id}"
