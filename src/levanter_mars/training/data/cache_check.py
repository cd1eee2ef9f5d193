"""Every token cache is held to its provenance record before anything is built or compiled.

The entry point calls :func:`check_and_prepare` on process 0 through ``distributed.leader_decides`` (a mismatch
raises ConfigError on every host), after validation and before any cache is built. The pieces, for other callers:
:func:`check_caches` (reads only), :func:`enforce` (warnings; the refusal), :func:`prepare` (moves aside, records);
:class:`CacheCheck` round-trips through JSON.

A record is written when a run decides to build a cache, before tokenizing: an interrupted build that Levanter
resumes later is then held to the sources it was started from.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Iterator

import fsspec
from levanter.data.text import LMMixtureDatasetConfig

from levanter_mars.training.config import ConfigError
from levanter_mars.training.data.sources import SPLITS, component_cache_dir, data_sources
from levanter_mars.training.data.provenance import (
    RECORD_FILE,
    Difference,
    differences,
    read_record,
    record_for,
    write_record,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheCheck:
    """What process 0 found, keyed by each split's cache directory. Plain data, so it can be broadcast."""

    cache_dir: str | None
    new: list[str] = field(default_factory=list)
    """No cache yet: this run builds it and records what from."""
    mismatched: dict[str, list[Difference]] = field(default_factory=dict)
    unrecorded: list[str] = field(default_factory=list)
    """Caches without a record (built before records existed, or by plain Levanter): used, with a warning."""
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> "CacheCheck":
        raw = json.loads(text)
        raw["mismatched"] = {path: [Difference(**d) for d in diffs] for path, diffs in raw["mismatched"].items()}
        return CacheCheck(**raw)


def cache_splits(data) -> Iterator[tuple[str, object, str, str]]:
    """(config field, source config, split, cache directory) of every cache the config can use (a mixture's source
    with no train weight has no train cache: Levanter neither builds nor loads it)."""
    for name, component in data_sources(data):
        root = component_cache_dir(data, component, name)
        if not root:
            continue
        for split in SPLITS:
            if split == "train" and not _trained_on(data, name):
                continue  # Levanter neither builds nor loads it
            yield name, component, split, os.path.join(root, split)


def _trained_on(data, name: str) -> bool:
    if not isinstance(data, LMMixtureDatasetConfig):
        return True
    weights = data.train_weights
    stages = [weights] if isinstance(weights, dict) else [w for _, w in weights]
    return any(stage.get(name.rsplit(".", 1)[-1], 0) > 0 for stage in stages)


def _has_source(component, split: str) -> bool:
    if hasattr(component, "train_urls"):
        return bool(getattr(component, f"{split}_urls", None))
    return getattr(component, "id", None) is not None


def _cache_contents(split_dir: str) -> list[str] | None:
    """Entries of a split's cache directory other than the record; None if there is no such directory."""
    fs, path = fsspec.core.url_to_fs(split_dir)
    if not fs.isdir(path):
        return None
    names = [os.path.basename(entry.rstrip("/")) for entry in fs.ls(path, detail=False)]
    return [name for name in names if not name.startswith(RECORD_FILE)]


def check_caches(data) -> CacheCheck:
    """Compares each existing cache's record with what ``data`` names now. Reads only; changes nothing."""
    check = CacheCheck(cache_dir=getattr(data, "cache_dir", None))
    for name, component, split, split_dir in cache_splits(data):
        contents = _cache_contents(split_dir)
        if not contents:  # nothing built yet (a record alone is from a run that stopped before building)
            if _has_source(component, split):
                check.new.append(split_dir)
            continue
        recorded = read_record(split_dir)
        if recorded is None:
            check.unrecorded.append(split_dir)
            continue
        found = differences(name, split, recorded, record_for(data, component, split, with_checksum=False))
        if found and all(d.missing_file for d in found):
            check.warnings.append(
                f"{', '.join(d.field for d in found)}: missing; the cache {split_dir} was built from it and nothing "
                "else changed, so training uses that cache"
            )
        elif found:
            check.mismatched[split_dir] = found
    return check


def refusal_message(check: CacheCheck) -> str:
    intro = "token caches there were built from other data than this config names."
    lines = [f"data.cache_dir={check.cache_dir}: {intro}"]
    for split_dir, found in check.mismatched.items():
        lines.append(f"  {split_dir} (recorded -> now):")
        lines.extend(f"    {d.describe()}" for d in found)
    lines += [
        "Training on them would train on the old tokens. Either",
        "  - set data.cache_dir to a new directory, or",
        "  - pass --data.rebuild_cache true: the old cache is moved aside (kept, never deleted), a new one is built.",
    ]
    return "\n".join(lines)


def enforce(check: CacheCheck, *, rebuild: bool) -> None:
    """Logs the warnings and raises :class:`ConfigError` on a mismatch unless rebuilding. The same on every host."""
    for warning in check.warnings:
        logger.warning(warning)
    if not rebuild:
        for split_dir in check.unrecorded:
            logger.warning(
                "Token cache %s has no provenance record (built before records existed, or by plain Levanter): its "
                "sources cannot be checked against this config; using it as it is. --data.rebuild_cache true moves "
                "it aside and builds a recorded one.", split_dir,
            )
    if check.mismatched and not rebuild:
        raise ConfigError(refusal_message(check))


def set_aside_cache(split_dir: str) -> str:
    """Moves a cache to ``<dir>.old-<time>`` (never deleting it; local or gs://). Returns where it went."""
    fs, path = fsspec.core.url_to_fs(split_dir)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    destination = f"{path.rstrip('/')}.old-{stamp}"
    suffix = 1
    while fs.exists(destination):  # two rebuilds within a second: never move one cache into another
        suffix += 1
        destination = f"{path.rstrip('/')}.old-{stamp}-{suffix}"
    fs.mv(path, destination, recursive=True)
    return fs.unstrip_protocol(destination) if "://" in split_dir else destination


def prepare(check: CacheCheck, data, *, rebuild: bool) -> dict[str, str]:
    """On process 0: with ``rebuild``, moves mismatched and record-less caches aside; then records what each cache
    about to be built is built from. Returns {cache: where it was moved}."""
    moved = {}
    if rebuild:
        for split_dir in [*check.mismatched, *check.unrecorded]:
            moved[split_dir] = set_aside_cache(split_dir)
            logger.warning("data.rebuild_cache=true: moved the token cache %s to %s", split_dir, moved[split_dir])
        for split_dir in check.new:
            logger.info("data.rebuild_cache=true: no cache at %s yet", split_dir)
    to_record = {*check.new, *moved}
    for name, component, split, split_dir in cache_splits(data):
        if split_dir in to_record and _has_source(component, split):
            write_record(split_dir, record_for(data, component, split))
    return moved


def check_and_prepare(data) -> CacheCheck:
    """One host: check, enforce and prepare in one call. Raises :class:`ConfigError` on a mismatch."""
    rebuild = getattr(data, "rebuild_cache", False)
    check = check_caches(data)
    enforce(check, rebuild=rebuild)
    prepare(check, data, rebuild=rebuild)
    return check
