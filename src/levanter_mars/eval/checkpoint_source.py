"""Which checkpoint the standalone evaluation reads: a ``step-N`` directory, the newest complete one of a run's
checkpoint directory, or an exported HF checkpoint directory. A path that holds no checkpoint is a config error (a
typo in the command); checkpoints that are there but cannot be used, or storage that cannot be read, are not."""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Optional

import fsspec

from levanter_mars.training.checkpointing.audit import audit_checkpoint, audit_run
from levanter_mars.training.checkpointing.storage import METADATA_NAME
from levanter_mars.training.config import ConfigError
from levanter_mars.training.errors import CheckpointError

logger = logging.getLogger(__name__)

HF_CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class CheckpointSource:
    path: str
    step: Optional[int]
    is_hf: bool


def _is_hf_directory(path: str) -> bool:
    fs, plain = fsspec.core.url_to_fs(path)
    return fs.exists(posixpath.join(plain, HF_CONFIG_NAME)) and not fs.exists(posixpath.join(plain, METADATA_NAME))


def _directory_or_config_error(fs, plain: str, path: str, named_by: str) -> None:
    """A path that is not there, or a file, is a config error (a typo in the command); storage that cannot be read
    (no permission, the storage service failing) is the checkpoint's (exit 5)."""
    try:
        kind = fs.info(plain)["type"]
    except FileNotFoundError:
        raise ConfigError(f"{named_by}: no such directory {path!r}") from None
    except Exception as e:  # noqa: BLE001 - fsspec backends raise OSError subclasses or their own service errors
        raise CheckpointError(f"{named_by} {path!r} cannot be read: {type(e).__name__}: {e}") from e
    if kind != "directory":
        raise ConfigError(f"{named_by}: {path!r} is a file, not a checkpoint directory")


def resolve_checkpoint(
    path: str, *, is_hf: Optional[bool] = None, verify_checksums: bool = True, named_by: str = "checkpoint_path"
) -> CheckpointSource:
    """The checkpoint to evaluate: ``path`` itself, or the newest complete checkpoint under it. A path that holds no
    checkpoint at all raises ConfigError naming ``named_by`` (the field that gave the path); checkpoints that are
    there but incomplete or corrupt raise CheckpointError."""
    fs, plain = fsspec.core.url_to_fs(path)
    _directory_or_config_error(fs, plain, path, named_by)
    if is_hf if is_hf is not None else _is_hf_directory(path):
        if not fs.exists(posixpath.join(plain, HF_CONFIG_NAME)):
            raise ConfigError(
                f"{named_by} {path!r} is not an HF checkpoint (checkpoint_is_hf): it has no {HF_CONFIG_NAME}"
            )
        return CheckpointSource(path, None, True)

    if fs.exists(posixpath.join(plain, METADATA_NAME)):
        candidates = [path]
    else:
        statuses = audit_run(path, verify_checksums=False)
        if not statuses:
            raise ConfigError(
                f"{named_by} {path!r} holds no checkpoint: no step-N directories, no {METADATA_NAME} "
                f"(a Levanter checkpoint) and no {HF_CONFIG_NAME} (an HF checkpoint)"
            )
        candidates = [s.path for s in statuses if s.usable]
        if not candidates:
            found = "; ".join(f"{s.path}: {s.state} ({s.reason})" for s in statuses)
            raise CheckpointError(f"{named_by} {path!r} holds no complete checkpoint ({found})")
    problems = []
    for candidate in candidates:
        status = audit_checkpoint(candidate, verify_checksums=verify_checksums)
        if status.usable:
            if problems:
                logger.warning("Skipped newer checkpoints: %s", "; ".join(problems))
            return CheckpointSource(candidate, status.step, False)
        problems.append(f"{candidate}: {status.state} ({status.reason})")
    raise CheckpointError(f"no usable checkpoint: {'; '.join(problems)}")
