"""``fresh=true``: the previous run directory, checkpoints and log file are moved aside, never deleted, once per
launch, and never half.

A launcher that retries (the pod runner after a dead host or a preemption, the plain-gcloud loop) runs the same
command again, ``fresh=true`` included. It names its launch in ``$LEVANTER_MARS_LAUNCH_ID``; the set-aside writes
that id into the new checkpoint directory (``FRESH_START.json``), and a later attempt of the same launch that finds it
resumes instead of throwing away what the first attempt trained. Without the variable (a plain command) every
invocation is a launch.

On object storage a move copies and deletes every object, and a preemption can stop it half-way. So the set-aside
first writes its intent (every move: from where to where, for which launch) beside the checkpoint directory, then
moves, then removes the intent and writes the marker. Whoever finds an intent, the next attempt of the same launch or
any later run (``fresh`` or not: it must not resume from half a checkpoint), finishes those very moves into the very
same destinations first. What is empty (a checkpoint directory the writability probe just created) is not moved.

With ``trainer.checkpointer.append_run_id_to_base_path: false`` the checkpoint directory is the base path, which
other runs may share: the marker is ``<base path>/<run id>.FRESH_START.json``, one per run, and only this run's
checkpoints (its ``step-N`` directories) and marker are moved, into ``<base path>/<run id>.old-<time>/``.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import posixpath
from typing import Mapping, Optional

from levanter_mars.training.checkpointing.audit import candidate_checkpoints
from levanter_mars.training.checkpointing.storage import fs_and_path, is_local
from levanter_mars.training.run.identity import checkpoint_dir, log_file, run_dir
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV
from levanter_mars.training.whole_files import write_whole

logger = logging.getLogger(__name__)

#: Written into the new run's checkpoint directory (shared by every host and attempt, local or gs://).
FRESH_MARKER = "FRESH_START.json"
#: Beside the checkpoint directory while a set-aside is under way.
INTENT_SUFFIX = ".fresh-intent.json"


def prepare(config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Before a run reads its checkpoints: with ``fresh=true``, the set-aside (once per launch); without, the end of
    a set-aside a preemption cut short, if any. Returns where things went. Process 0 only."""
    if config.fresh:
        return set_aside_run(config, environ)
    intent = read_intent(config)
    return [] if intent is None else _finish(config, intent)


def set_aside_run(config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Moves the run directory, the run's checkpoints and its log file aside, unless this launch already did (or
    began to: then it finishes those moves). Returns where they went."""
    launch_id = environ.get(LAUNCH_ID_ENV)
    intent = read_intent(config)
    if intent is not None:
        moved = _finish(config, intent)
        if launch_id and intent.get("launch_id") == launch_id:
            return moved
    elif launch_id and applied_by(config) == launch_id:
        logger.warning("fresh=true was applied by an earlier attempt of this launch (%s): resuming its run", launch_id)
        return []
    intent = {"launch_id": launch_id, "moves": _planned_moves(config),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}  # fmt: skip
    if intent["moves"]:
        _write_json(_intent_path(config), intent)
    return _carry_out(config, intent)


def _finish(config, intent: dict) -> list[str]:
    logger.warning("fresh=true: finishing the set-aside of launch %s, which was interrupted", intent.get("launch_id"))
    return _carry_out(config, intent)


def applied_by(config) -> Optional[str]:
    """The launch whose ``fresh=true`` started the run now in the checkpoint directory, if any."""
    for path in (_marker(config), _legacy_marker(config)):
        record = _read_json(path) if path else None
        if isinstance(record, dict):
            return record.get("launch_id")
    return None


def read_intent(config) -> Optional[dict]:
    intent = _read_json(_intent_path(config))
    return intent if isinstance(intent, dict) and isinstance(intent.get("moves"), list) else None


def _carry_out(config, intent: dict) -> list[str]:
    """Makes every move of ``intent`` (what is left of it), then replaces the intent by the marker."""
    for source, destination in intent["moves"]:
        if _move_remaining(source, destination):
            logger.warning("fresh=true: moved %s to %s", source, destination)
    moved = [destination for _, destination in intent["moves"]]
    # The intent goes first: an intent found later would move whatever is at its sources then, which after the marker
    # is this launch's own run. Killed in between, the next attempt finds neither, and nothing left to move.
    _delete(_intent_path(config))
    if intent.get("launch_id"):
        _write_json(_marker(config), {"launch_id": intent["launch_id"], "set_aside": moved})
    return moved


def _planned_moves(config) -> list[list[str]]:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for suffix in ("", *(f"-{i}" for i in range(2, 1000))):  # two --fresh runs within a second: never merge them
        moves = [[source, destination(stamp + suffix)] for source, destination in _movable(config)]
        if not any(_exists(d) for _, d in moves):
            return moves
    raise RuntimeError(f"fresh=true: no free .old-{stamp}-N name beside {checkpoint_dir(config)}")


def _movable(config):
    """``(source, destination-of-stamp)`` of everything of this run worth setting aside (nothing empty): its run
    directory, its checkpoints, its log file."""
    def beside(path: str):
        return path, lambda stamp: f"{path.rstrip('/')}.old-{stamp}"

    found = [beside(str(run_dir(config)))]
    ckpt = checkpoint_dir(config)
    if config.trainer.checkpointer.append_run_id_to_base_path:
        if not _is_empty(ckpt, ignoring=FRESH_MARKER):  # a marker alone: an earlier launch's fresh start, never run
            found.append(beside(ckpt))
    else:  # a base path other runs may share: this run's checkpoints and marker only
        aside = posixpath.join(ckpt, config.trainer.id)
        own = [p for p in candidate_checkpoints(ckpt) if p.rstrip("/") != ckpt.rstrip("/")] + [_marker(config)]
        for path in own:
            name = posixpath.basename(path.rstrip("/"))
            found.append((path, lambda stamp, n=name: f"{aside}.old-{stamp}/{n}"))
    found.append(beside(str(log_file(config))))
    return [(source, destination) for source, destination in found if not _is_empty(source)]


def _move_remaining(source: str, destination: str) -> bool:
    """Moves what is still at ``source`` to ``destination``, object by object where there is no rename, so that a
    move interrupted anywhere is finished by calling this again. Returns whether anything moved."""
    fs, src = fs_and_path(source)
    _, dst = fs_and_path(destination)
    if not fs.exists(src):
        return False
    if is_local(fs) and not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        try:
            os.rename(src, dst)  # one atomic step
            return True
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
    files = [src] if fs.isfile(src) else sorted(fs.find(src))
    for path in files:
        target = dst if path == src else posixpath.join(dst, posixpath.relpath(path, src))
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        fs.copy(path, target)
        fs.rm(path)  # after its copy: interrupted between the two, the next call copies it again
    if fs.exists(src):
        fs.rm(src, recursive=True)  # the directories left behind (none on object storage)
    return True


def _is_empty(path: str, ignoring: str = "") -> bool:
    """Whether ``path`` holds nothing: absent, an empty file, or a directory of no files but ``ignoring``."""
    fs, plain = fs_and_path(path)
    if not fs.exists(plain):
        return True
    if fs.isfile(plain):
        return fs.size(plain) == 0
    return all(posixpath.relpath(p, plain) == ignoring for p in fs.find(plain))


def _exists(path: str) -> bool:
    fs, plain = fs_and_path(path)
    return fs.exists(plain)


def _marker(config) -> str:
    ckpt = checkpoint_dir(config).rstrip("/")
    if config.trainer.checkpointer.append_run_id_to_base_path:
        return ckpt + "/" + FRESH_MARKER
    return posixpath.join(ckpt, f"{config.trainer.id}.{FRESH_MARKER}")  # a base path other runs may share


def _legacy_marker(config) -> Optional[str]:
    """Before 2026-12 a shared base path held one ``FRESH_START.json`` for every run: still read, for a launch in
    flight across an upgrade (a launch id names one launch, so a marker naming this launch is this run's)."""
    if config.trainer.checkpointer.append_run_id_to_base_path:
        return None
    return checkpoint_dir(config).rstrip("/") + "/" + FRESH_MARKER


def _intent_path(config) -> str:
    ckpt = checkpoint_dir(config).rstrip("/")
    if config.trainer.checkpointer.append_run_id_to_base_path:
        return ckpt + INTENT_SUFFIX
    return posixpath.join(ckpt, config.trainer.id + INTENT_SUFFIX)  # the base path itself may be a bucket's root


def _read_json(path: str):
    fs, plain = fs_and_path(path)
    try:
        with fs.open(plain, "r") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def _write_json(path: str, value: dict) -> None:
    write_whole(path, json.dumps(value, indent=1))  # whole or absent, never torn


def _delete(path: str) -> None:
    fs, plain = fs_and_path(path)
    if fs.exists(plain):
        fs.rm(plain)
