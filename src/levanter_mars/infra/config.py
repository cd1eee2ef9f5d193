"""Launcher configs (frozen draccus dataclasses) and their command line.

``python -m levanter_mars.infra.launch --config_path X.yaml --tpu_type v4-32 [--flag value ...] [-- overrides]``:
everything after ``--`` is passed to the training command (``--trainer.num_train_steps 100``). ``--config_path``
names the *training* config (draccus reserves that name for its own use, so it is read here first).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, TypeVar

import draccus

# Credentials handed from the launching shell to every training process, never to disk or a log.
DEFAULT_SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Where a Ray job carries them: its metadata (see ray_job.py for why not its runtime environment).
SECRET_METADATA_PREFIX = "levanter_mars.secret."


class LaunchError(ValueError):
    """Bad launcher input or an unusable cluster: the message names the flag, field or resource."""


#: Other spellings of a slice name's generation: Google Cloud's docs call v5e slices ``v5e-N`` beside ``v6e-N``, where
#: the TPU API and Levanter's table say ``v5litepod-N``.
TPU_TYPE_ALIASES = {"v5e": "v5litepod"}


def canonical_tpu_type(name: str) -> str:
    """``v5e-16`` -> ``v5litepod-16``; any other name as given. Applied once, where a command line is parsed."""
    generation, dash, size = name.partition("-")
    return TPU_TYPE_ALIASES.get(generation, generation) + dash + size if dash else name


@dataclass(frozen=True)
class JobConfig:
    """What to train where: shared by the Ray launcher and the plain-gcloud launcher."""

    tpu_type: str
    """Slice type from Levanter's TPU table (v4-32, v5litepod-16, v5p-8, v6e-8, ...; v5e-16 is read as v5litepod-16),
    or ``cpu``: the local engine."""
    train_config: str = ""
    """The training YAML (given as ``--config_path``): a path inside the working directory, or a gs:// URL."""
    num_slices: str = "1"
    """How many slices (multi-slice data parallelism over DCN; see docs/pods.md, "Multi-slice"). A list, ``2,1``,
    lets the run limp: after a slice is preempted it restarts on the largest count that has slices now, with the same
    global batch (more microbatches per step), and grows back once slices return (``scale_up_wait_s``)."""
    scale_up_wait_s: float = 600.0
    """With several slice counts: how long an attempt on fewer slices runs before, slices being free again, it is
    asked to stop at its next checkpoint and restart on more."""
    retries: int = 3
    """Restarts after a failure of the training program (a non-zero exit), each resuming from the newest checkpoint."""
    preemption_retries: int = 100
    """Restarts after a preemption or a lost host, counted separately from ``retries``."""
    storage_retries: int = 2
    """Restarts after the run found its checkpoint storage unusable (exit 5: a full disk, or a passing failure of the
    storage service at an attempt's start), counted separately; past them the launch ends with exit 5."""
    run_id: Optional[str] = None
    """The run id every attempt resumes under. Default: the config's ``trainer.id``, else one derived from it."""
    secret_env: tuple[str, ...] = DEFAULT_SECRET_ENV
    """Environment variables copied from this shell to the training processes; their values are never printed."""
    dry_run: bool = False
    """Print the resolved config, the job, its environment (secrets redacted) and the resources; contact nothing."""

    @property
    def slice_counts(self) -> tuple[int, ...]:
        """The allowed slice counts, largest first."""
        return parse_slice_counts(self.num_slices)

    @property
    def max_slices(self) -> int:
        return self.slice_counts[0]


@dataclass(frozen=True)
class RayLaunchConfig(JobConfig):
    """``python -m levanter_mars.infra.launch``: submit the run as a Ray job."""

    address: Optional[str] = None
    """Ray dashboard address (``http://127.0.0.1:8265``). Default: ``$RAY_ADDRESS``, else http://127.0.0.1:8265;
    for ``--tpu_type cpu``, else a private cluster on 127.0.0.1 that lives as long as this command."""
    follow: bool = True
    """Stream the job's log until it ends and exit with its status; otherwise print how to watch it and return
    (not on a private local cluster, which lives as long as this command)."""
    stop_job_on_interrupt: bool = False
    """While following: Ctrl-C or SIGTERM stops the Ray job too (by default the job goes on and the launcher says
    how to watch it). ``compare`` sets it, so that a stopped comparison leaves no run training on the pod."""
    working_dir: str = "."
    """Shipped to the cluster with the job (TPU types): the code and configs the hosts run. The local engine runs
    in this directory directly, so relative paths in the config (checkpoints, logs) land where you expect."""
    num_hosts: int = 1
    """``--tpu_type cpu`` only: training processes per slice of the local pod (1, 2, 4 or 8), one per simulated host,
    joined by ``jax.distributed`` as a TPU slice's hosts are (with ``--num_slices S``, all S x N of them, at most
    8)."""
    devices_per_host: Optional[int] = None
    """``--tpu_type cpu`` only: simulated CPU devices of each host. Default: what this shell's XLA_FLAGS
    (``--xla_force_host_platform_device_count``) give one process, else 1."""



def parse_slice_counts(value: str | int) -> tuple[int, ...]:
    """``"2,1"`` -> ``(2, 1)``; ``"4"`` -> ``(4,)``. Raises LaunchError naming ``--num_slices``."""
    try:
        counts = [int(part) for part in str(value).split(",")]
    except ValueError:
        raise LaunchError(f"--num_slices {value!r}: a count of slices, or a list of them (2,1)") from None
    if any(n < 1 for n in counts):
        raise LaunchError(f"--num_slices must be >= 1, got {value}")
    if len(set(counts)) != len(counts):
        raise LaunchError(f"--num_slices {value}: each count once")
    return tuple(sorted(counts, reverse=True))


ConfigT = TypeVar("ConfigT", bound=JobConfig)

_CONFIG_FLAG = "--config_path"


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``[launcher flags] -- [training overrides]``."""
    argv = list(argv)
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def parse_args(argv: Sequence[str], config_class: type[ConfigT]) -> tuple[ConfigT, list[str]]:
    """Returns the launcher config and the training overrides. Raises :class:`LaunchError` naming the flag."""
    own, overrides = split_overrides(argv)
    switches = {f"--{f.name}" for f in dataclasses.fields(config_class) if f.type in (bool, "bool")}
    renamed: list[str] = []
    for i, arg in enumerate(own):
        if arg == _CONFIG_FLAG:
            arg = "--train_config"
        elif arg.startswith(_CONFIG_FLAG + "="):
            arg = "--train_config=" + arg[len(_CONFIG_FLAG) + 1 :]
        renamed.append(arg)
        if arg in switches and (i + 1 == len(own) or own[i + 1].startswith("--")):
            renamed.append("true")  # a bare switch (`--dry_run`) means true
    try:
        config = draccus.parse(config_class, args=renamed)
    except SystemExit as e:  # argparse reports the problem on stderr itself
        raise LaunchError(f"bad arguments for {config_class.__name__} (see the message above): {' '.join(own)}") from e
    except (draccus.utils.DecodingError, draccus.utils.ParsingError, ValueError) as e:
        raise LaunchError(str(e)) from e
    config = dataclasses.replace(config, tpu_type=canonical_tpu_type(config.tpu_type))
    check(config)
    return config, overrides


def check(config: JobConfig) -> None:
    if not config.train_config:
        raise LaunchError("--config_path is required: the training YAML")
    parse_slice_counts(config.num_slices)
    if config.scale_up_wait_s < 0:
        raise LaunchError(f"--scale_up_wait_s must be >= 0, got {config.scale_up_wait_s}")
    if config.retries < 0:
        raise LaunchError(f"--retries must be >= 0, got {config.retries}")
    if config.preemption_retries < 0:
        raise LaunchError(f"--preemption_retries must be >= 0, got {config.preemption_retries}")
    if config.storage_retries < 0:
        raise LaunchError(f"--storage_retries must be >= 0, got {config.storage_retries}")
