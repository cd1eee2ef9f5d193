"""The plain-gcloud path: a queued-resource TPU slice, the project's Docker image on every host, no Ray.

``python -m levanter_mars.infra.gcloud --config_path config/X.yaml --tpu_type v4-32 --project P --zone Z
--image REGION-docker.pkg.dev/P/levanter-mars/levanter-mars:TAG [--num_slices N] [--capacity spot] [--retries K]
[--preemption_retries P] [--dry_run] [-- training overrides]``

It creates the queued resource, waits for it, pulls the image on every host, and runs the training command in a
container on every host over ``gcloud ... ssh``. The hosts' exits are judged by the outcome policy every
launcher shares (``training/outcome.py``): a crash while the slice is still ACTIVE is a failure (rerun on the same
slice); a slice that left ACTIVE was preempted (deleted and created again); both resume from the newest checkpoint
under the same run id. A stop the run decided (a config error, a non-finite stop, ...) ends the launch at once with the
run's own exit code, and every
attempt carries the launch's id, so that ``fresh=true`` is applied once per launch. Credentials go to each container
through ssh's stdin (``docker run --env-file /dev/stdin``): never on a command line, which gcloud would write to its
logs.
``--dry_run`` prints every command instead of running it.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from levanter.infra.docker import make_docker_run_command

from levanter_mars.infra.config import JobConfig, LaunchError
from levanter_mars.infra.host import TRAIN_MODULE
from levanter_mars.infra.plan import REDACTED, PreparedRun, prepare_cli
from levanter_mars.training.errors import DECIDED_STOPS
from levanter_mars.training.outcome import LOST, RetryBudget, judge
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV, new_launch_id

CAPACITY_FLAGS = {"spot": ["--spot"], "on-demand": [], "reserved": ["--reserved"]}
CONTAINER = "levanter-mars"
ACTIVE = "ACTIVE"
# Queued-resource states from which the slice will not come back: delete it and queue a new one.
GONE = ("FAILED", "SUSPENDED", "SUSPENDING", "DELETING", "NOT_FOUND")


@dataclass(frozen=True)
class GcloudLaunchConfig(JobConfig):
    project: str = ""
    zone: str = ""
    image: str = ""
    """The image built from infra/Dockerfile and pushed to Artifact Registry (REGION-docker.pkg.dev/...)."""
    name: Optional[str] = None
    """Queued resource (and node prefix) name. Default: lm-<run id>."""
    capacity: str = "spot"
    """spot (preemptible), on-demand or reserved."""
    poll_seconds: float = 30.0
    keep: bool = False
    """Leave the slice up at the end (default: delete it)."""


def check(config: GcloudLaunchConfig) -> None:
    for flag in ("project", "zone", "image"):
        if not getattr(config, flag):
            raise LaunchError(f"--{flag} is required for the gcloud path")
    if config.capacity not in CAPACITY_FLAGS:
        raise LaunchError(f"--capacity must be one of {sorted(CAPACITY_FLAGS)}, got {config.capacity!r}")
    if config.tpu_type == "cpu":
        raise LaunchError("--tpu_type cpu is the local Ray engine: use python -m levanter_mars.infra.launch")
    if len(config.slice_counts) > 1:
        raise LaunchError(f"--num_slices {config.num_slices}: the gcloud path queues one slice count; a run that "
                          "limps on fewer slices needs the Ray launcher (python -m levanter_mars.infra.launch)")


@dataclass(frozen=True)
class Step:
    """One gcloud invocation; ``stdin`` holds credentials and is never printed."""

    argv: tuple[str, ...]
    what: str
    stdin: Optional[Mapping[str, str]] = None

    def render(self) -> str:
        line = f"# {self.what}\n{shlex.join(self.argv)}"
        if self.stdin:
            line += "\n#   stdin: " + " ".join(f"{k}={REDACTED!r}" for k in sorted(self.stdin))
        return line


class GcloudPlan:
    """The exact gcloud commands of a run (pure: building them contacts nothing)."""

    def __init__(self, run: PreparedRun, launch: GcloudLaunchConfig, launch_id: Optional[str] = None):
        self.run, self.launch = run, launch
        self.launch_id = launch_id or new_launch_id()  # every attempt's: fresh=true is applied once per launch
        self.name = launch.name or f"lm-{run.run_id}".lower().replace("_", "-")[:60]
        self._where = ("--project", launch.project, "--zone", launch.zone)

    @property
    def nodes(self) -> list[str]:
        n = self.launch.max_slices
        return [self.name] if n == 1 else [f"{self.name}-{i}" for i in range(n)]

    def create(self) -> Step:
        layout = ["--node-id", self.name] if self.launch.max_slices == 1 else [
            "--node-count", str(self.launch.max_slices), "--node-prefix", self.name,
        ]  # fmt: skip
        argv = (
            "gcloud", "compute", "tpus", "queued-resources", "create", self.name, *self._where,
            "--accelerator-type", self.run.slice.name, "--runtime-version", self.run.slice.runtime_version,
            *layout, *CAPACITY_FLAGS[self.launch.capacity],
        )  # fmt: skip
        return Step(argv, f"queue {self.launch.max_slices} x {self.run.slice.name} ({self.launch.capacity})")

    def describe(self) -> Step:
        argv = ("gcloud", "compute", "tpus", "queued-resources", "describe", self.name, *self._where,
                "--format=value(state.state)")  # fmt: skip
        return Step(argv, f"poll every {self.launch.poll_seconds:g}s until ACTIVE")

    def _ssh(self, node: str, worker: str, command: str) -> tuple[str, ...]:
        return ("gcloud", "compute", "tpus", "tpu-vm", "ssh", node, *self._where, f"--worker={worker}",
                "--quiet", "--command", command)  # fmt: skip

    def setup(self, node: str) -> Step:
        registry = self.launch.image.split("/", 1)[0]
        command = (
            f"sudo gcloud auth configure-docker {shlex.quote(registry)} --quiet && "
            f"sudo docker pull {shlex.quote(self.launch.image)}"
        )
        return Step(self._ssh(node, "all", command), f"pull the image on every host of {node}")

    def container_command(self) -> list[str]:
        env = {"RUN_ID": self.run.run_id, LAUNCH_ID_ENV: self.launch_id}
        docker = make_docker_run_command(
            self.launch.image, ["python", "-m", TRAIN_MODULE, *self.run.train_argv], foreground=True, env=env,
            name=CONTAINER,
        )  # fmt: skip
        if self.run.secrets:
            docker[2:2] = ["--env-file", "/dev/stdin"]  # after `docker run`
        return docker

    def train(self, node: str, worker: int) -> Step:
        command = f"sudo docker rm -f {CONTAINER} >/dev/null 2>&1; sudo {shlex.join(self.container_command())}"
        return Step(self._ssh(node, str(worker), command), f"train on {node} host {worker}", self.run.secrets or None)

    def delete(self) -> Step:
        argv = ("gcloud", "compute", "tpus", "queued-resources", "delete", self.name, *self._where,
                "--force", "--quiet")  # fmt: skip
        return Step(argv, "delete the slice")

    def render(self) -> str:
        hosts = [self.train(node, w) for node in self.nodes for w in range(self.run.slice.hosts)]
        steps = [self.create(), self.describe(), *[self.setup(node) for node in self.nodes], *hosts]
        if not self.launch.keep:
            steps.append(self.delete())
        return "\n".join(step.render() for step in steps)


def _env_file(secrets: Mapping[str, str]) -> bytes:
    for name, value in secrets.items():
        if "\n" in value:
            raise LaunchError(f"${name} contains a newline: it cannot travel as a docker --env-file line")
    return "".join(f"{k}={v}\n" for k, v in secrets.items()).encode()


class GcloudRunner:
    """Runs a :class:`GcloudPlan`; ``spawn`` and ``sleep`` are injectable for tests."""

    def __init__(self, plan: GcloudPlan, spawn: Callable[..., subprocess.Popen] = subprocess.Popen,
                 sleep: Callable[[float], None] = time.sleep, out=sys.stdout):  # fmt: skip
        self.plan, self.spawn, self.sleep, self.out = plan, spawn, sleep, out

    def _say(self, message: str) -> None:
        print(f"[gcloud launcher] {message}", file=self.out, flush=True)

    def _call(self, step: Step, capture: bool = False) -> subprocess.CompletedProcess:
        self._say(step.what)
        proc = self.spawn(list(step.argv), stdout=subprocess.PIPE if capture else None, text=True)
        stdout, _ = proc.communicate()
        return subprocess.CompletedProcess(step.argv, proc.returncode, stdout or "")

    def state(self) -> str:
        result = self._call(self.plan.describe(), capture=True)
        return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else "NOT_FOUND"

    def wait_active(self) -> None:
        while True:
            state = self.state()
            if state == ACTIVE:
                return
            if state in GONE:
                if state != "NOT_FOUND":
                    self._call(self.plan.delete())
                created = self._call(self.plan.create())
                if created.returncode != 0:
                    raise LaunchError(f"gcloud could not queue the slice (exit {created.returncode}); see above")
            self.sleep(self.plan.launch.poll_seconds)

    def train_once(self) -> list[int]:
        procs = []
        for node in self.plan.nodes:
            for worker in range(self.plan.run.slice.hosts):
                step = self.plan.train(node, worker)
                self._say(step.what)
                proc = self.spawn(list(step.argv), stdin=subprocess.PIPE if step.stdin else None)
                if step.stdin:
                    proc.stdin.write(_env_file(step.stdin))
                    proc.stdin.close()
                procs.append(proc)
        return [proc.wait() for proc in procs]

    def run(self) -> int:
        job = self.plan.run.job
        budget = RetryBudget(failure=job.retries, preemption=job.preemption_retries, storage=job.storage_retries)
        used: dict[str, int] = {}
        try:
            while True:
                self.wait_active()
                for node in self.plan.nodes:
                    self._call(self.plan.setup(node))
                codes = self.train_once()
                # A slice that left ACTIVE took its hosts with it: ssh's report of a host is its loss, unless the
                # training program had ended first with a stop it decided (which then wins: training/outcome.py).
                lost = not all(c == 0 for c in codes) and self.state() != ACTIVE
                exits = [LOST if lost and c not in DECIDED_STOPS else c for c in codes]
                verdict = judge(exits, budget, used)
                self._say(f"{verdict.action.replace('_', ' ')}: {verdict.reason}")
                if verdict.ends:
                    return verdict.exit_code
                used[verdict.retry_kind] = used.get(verdict.retry_kind, 0) + 1
        finally:
            if not self.plan.launch.keep:
                self._call(self.plan.delete())


def cli(argv: Optional[Sequence[str]] = None) -> int:
    prepared = prepare_cli(sys.argv[1:] if argv is None else list(argv), GcloudLaunchConfig, checks=[check])
    if isinstance(prepared, int):
        return prepared
    launch, run = prepared
    plan = GcloudPlan(run, launch)
    if launch.dry_run:
        print(plan.run.report({"queued_resource": plan.name, "nodes": plan.nodes}, commands=plan.render()))
        return 0
    try:
        return GcloudRunner(plan).run()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())
