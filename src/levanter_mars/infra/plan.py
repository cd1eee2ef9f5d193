"""Resolving a launch before anything is contacted: the training config, the run id, the checks, the mesh, the
credentials to forward. Shared by the Ray launcher and the plain-gcloud launcher."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import draccus
import yaml

from levanter_mars.infra import limping
from levanter_mars.infra.config import JobConfig, LaunchError
from levanter_mars.infra.slices import MeshPlan, SliceType, check_local_nodes, launch_slice
from levanter_mars.training import validation
from levanter_mars.program_config import TrainAndEvalConfig, parse_train_config
from levanter_mars.training.run.identity import stable_run_id


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else str(value)


REDACTED = "<redacted: copied from the launching shell's environment>"


@dataclass(frozen=True)
class PreparedRun:
    job: JobConfig
    slice: SliceType
    config: TrainAndEvalConfig
    run_id: str
    train_argv: tuple[str, ...]
    """The training command's arguments on every host: the config, the overrides, and the pinned run id."""
    mesh: MeshPlan
    """The largest allowed slice count's (``meshes`` has every count's)."""
    secrets: Mapping[str, str]
    """Values of ``job.secret_env`` found in the environment: passed on, never printed."""
    checks_skipped: tuple[str, ...] = ()
    """What the validation could not check from here (a dry run contacts nothing and writes nothing)."""
    meshes: Mapping[int, MeshPlan] = dataclasses.field(default_factory=dict)
    """Each allowed slice count's mesh, largest first (``--num_slices 2,1``: a run that may limp)."""

    def describe(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "tpu_type": self.slice.name,
            "slices": self.job.max_slices,
            "hosts": {"per_slice": self.slice.hosts, "total": self.slice.hosts * self.job.max_slices},
            "retries": {"failure": self.job.retries, "preemption": self.job.preemption_retries},
            "resources": self.slice.job_resources(self.job.max_slices),
            "mesh": self.mesh.describe(),
            **({"limping": limping.describe(self.meshes, self.job.scale_up_wait_s)} if len(self.meshes) > 1 else {}),
            "secrets_forwarded": {name: REDACTED for name in sorted(self.secrets)},
            "secrets_not_set": sorted(set(self.job.secret_env) - set(self.secrets)),
            "training_command": ["python", "-m", "levanter_mars.main.train_lm", *self.train_argv],
            "validation": {"as training runs it": "every check", "not checked here": list(self.checks_skipped)},
            **({"local_pod": self._local_pod()} if self.slice.is_local else {}),
        }

    def _local_pod(self) -> dict[str, Any]:
        from levanter_mars.infra.host import distributed_flags, with_device_count

        hosts, slices = self.slice.hosts, self.job.max_slices
        per_host: dict[str, Any] = {"XLA_FLAGS": with_device_count("", self.slice.devices_per_host)}
        if slices > 1:  # as run_on_pod sets them per slice
            per_host["MEGASCALE_NUM_SLICES"] = str(slices)
            per_host["MEGASCALE_SLICE_ID"] = f"<slice: 0..{slices - 1}>"
        if hosts * slices > 1:
            process_id = f"<host: 0..{hosts - 1}>" if slices == 1 else f"<slice> * {hosts} + <host: 0..{hosts - 1}>"
            per_host["training_flags"] = distributed_flags(hosts * slices, process_id, "<free port, per attempt>")
        return {"slices": slices, "hosts": hosts, "devices_per_host": self.slice.devices_per_host,
                "per_host": per_host}  # fmt: skip

    def report(self, sections: Mapping[str, Any], commands: str = "") -> str:
        """The dry-run text: the plan (with ``sections``), any commands, and the resolved training config."""
        plan = {"dry_run": "nothing was contacted (no Ray, no GCP)", **sections, **self.describe()}
        text = "# levanter-mars launch plan\n" + readable_yaml(plan)
        if commands:
            text += "---\n# commands, in order\n" + commands + "\n"
        return text + "---\n# resolved training config\n" + self.resolved_config_yaml()

    def resolved_config_yaml(self) -> str:
        plain = json.loads(json.dumps(draccus.encode(self.config), default=_plain))
        return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (pre-flight's table) as YAML block literals, which read as they print, instead of one
    quoted line of escaped newlines."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if "\n" in text:
        # With a line ending in spaces PyYAML quotes the string after all; in a table they carry nothing.
        text = "\n".join(line.rstrip() for line in text.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_str(text)


_ReadableDumper.add_representer(str, _represent_str)


def readable_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_ReadableDumper, sort_keys=False, default_flow_style=False)


def is_url(path: str) -> bool:
    return bool(urllib.parse.urlparse(path).scheme) and "://" in path


def _check_shipped_path(path: str, working_dir: str, flag: str) -> None:
    """On a pod the training config must reach the hosts: inside the shipped working directory, or a URL."""
    if is_url(path):
        return
    absolute = os.path.realpath(os.path.join(working_dir, path) if not os.path.isabs(path) else path)
    root = os.path.realpath(working_dir)
    if os.path.commonpath([absolute, root]) != root:
        raise LaunchError(
            f"{flag} {path!r} is outside the working directory {root!r} that is shipped to the hosts: "
            "move it inside, or use a gs:// URL"
        )


def _check_for_pod(config: TrainAndEvalConfig) -> None:
    base = config.trainer.checkpointer.base_path
    if not is_url(str(base)):
        raise LaunchError(
            f"trainer.checkpointer.base_path={base!r} is local, but on a pod every host writes its shards there and "
            "a retry on a fresh VM must find them: use a gs:// bucket"
        )


def prepare(
    job: JobConfig, overrides: Sequence[str], *, working_dir: str = ".", environ: Mapping[str, str] = os.environ
) -> PreparedRun:
    """Parses, validates (as the training program does) and plans. Raises LaunchError or ConfigError naming the field.
    A dry run contacts nothing and writes nothing: it skips the checks that would (and lists them)."""
    kind = launch_slice(job.tpu_type, getattr(job, "num_hosts", 1), getattr(job, "devices_per_host", None))
    if kind.is_local:
        check_local_nodes(kind.hosts, job.max_slices)
    if not kind.is_local:
        _check_shipped_path(job.train_config, working_dir, "--config_path")

    config_path = (
        job.train_config
        if is_url(job.train_config) or os.path.isabs(job.train_config)
        else os.path.join(working_dir, job.train_config)
    )
    config = parse_train_config(["--config_path", config_path, *overrides])
    run_id = job.run_id or stable_run_id(config)  # before the pin: allowing fewer slices keeps the run's id
    pinned = limping.pinned_microbatch(config.trainer, kind.devices, job.slice_counts)
    if pinned:  # every count cuts the batch into the largest count's microbatches
        overrides = (*overrides, *pinned)
        config = parse_train_config(["--config_path", config_path, *overrides])
    config.trainer.id = run_id

    # The training program's own validation (training/validation.py), for the slice's devices, where the hosts will
    # run it: what would stop the run there stops the launch here, before anything is submitted or compiled.
    validation.check_fields(config)
    meshes = limping.plan_meshes(config.trainer, kind.devices, job.slice_counts)  # names --num_slices: no fit
    mesh = meshes[job.max_slices]
    if not kind.is_local:
        _check_for_pod(config)
    with contextlib.chdir(working_dir):
        skipped = validation.check_surroundings(
            config, device_count=mesh.devices, offline=job.dry_run, probe_writes=not job.dry_run, elsewhere=True
        )

    secrets = {name: environ[name] for name in job.secret_env if environ.get(name)}
    train_argv = ("--config_path", job.train_config, *overrides, "--trainer.id", run_id)
    return PreparedRun(job, kind, config, run_id, train_argv, mesh, secrets, tuple(skipped), meshes)


def prepare_cli(
    argv: Sequence[str], config_class: type, checks: Sequence[Callable[[Any], None]] = ()
) -> tuple[Any, PreparedRun] | int:
    """The launchers' common start: parse, check, prepare. On bad input prints the error and returns exit code 2; on
    storage the run could not write (its write probes), 5."""
    from levanter_mars.infra.config import parse_args
    from levanter_mars.training.config import ConfigError
    from levanter_mars.training.errors import CheckpointError, ExitCode

    try:
        launch, overrides = parse_args(argv, config_class)
        for check in checks:
            check(launch)
        return launch, prepare(launch, overrides, working_dir=getattr(launch, "working_dir", "."))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT_STORAGE
    return 2
