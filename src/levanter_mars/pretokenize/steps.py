"""The data step for a whole training config: which splits come from a dataset repository (``data.configs.X.id``),
their dry run, the checks before anything is written, and their builds; URL sources go to the serial builder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from levanter.data.text import TextLmDatasetFormat, preprocessor_for_format

from levanter_mars.pretokenize.build import SplitSource, build_split
from levanter_mars.pretokenize.dataset_repo import DatasetRepo, RepoFile
from levanter_mars.pretokenize.errors import CachePathError, StorageTrouble
from levanter_mars.pretokenize.mirror import join
from levanter_mars.pretokenize.options import PretokenizeOptions
from levanter_mars.training.config import ConfigError
from levanter_mars.training.data import cache_check
from levanter_mars.training.data import sources as data_sources

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubSplit:
    source: SplitSource
    files: list[RepoFile]


def _text_key(field: str, component) -> str:
    if not isinstance(component.format, TextLmDatasetFormat):
        raise ConfigError(f"{field}.format: the data step tokenizes text sources (type: text); this one is "
                          f"{type(component.format).__name__}")  # fmt: skip
    return component.format.text_key


def hub_splits(data, options: PretokenizeOptions) -> list[HubSplit]:
    """Every split of every dataset-repository source, with its files (listing the repository; no data read). A build
    lists each repository at the hub's commit of now, which it then reads every file at (the dry run lists the head)."""
    out: list[HubSplit] = []
    processors: dict = {}
    repos: dict = {}
    for field, component, split, split_dir in cache_check.cache_splits(data):
        if getattr(component, "id", None) is None:
            continue
        text_key = _text_key(field, component)
        if text_key not in processors:  # one per text field: sources of a mixture may name theirs differently
            processors[text_key] = preprocessor_for_format(component.format, _tokenizer(data), enforce_bos=True,
                                                           enforce_eos=data.enforce_eos)  # fmt: skip
        if field not in repos:
            repos[field] = _repository(component.id, field, pin=not options.dry_run)
        repo = repos[field]
        files = _listed(repo, component.name, split)
        if split == "train" and not files:
            raise ConfigError(f"{field}: config {component.name or 'default'!r} of {component.id!r} has no train "
                              "files")  # fmt: skip
        root = split_dir.rstrip("/").rsplit("/", 1)[0]
        mirror_dir = join(options.mirror_dir, field.rsplit(".", 1)[-1]) if options.mirror_dir else join(root, "mirror")
        out.append(HubSplit(SplitSource(field, repo, component.name, split, split_dir, mirror_dir, text_key,
                                        processors[text_key], getattr(data, "rebuild_cache", False)), files))  # fmt: skip
    return out


def _repository(dataset_id: str, field: str, *, pin: bool) -> DatasetRepo:
    repo = DatasetRepo(dataset_id, field=field)
    if not (pin and repo.on_hub):
        return repo
    try:
        revision = repo.resolved_revision()
    except Exception as e:  # noqa: BLE001
        raise StorageTrouble(f"{field}.id: cannot reach the hub for {dataset_id!r}: {e}") from e
    return DatasetRepo(dataset_id, field=field, revision=revision)


def _tokenizer(data):
    try:
        return data.the_tokenizer
    except OSError as e:  # transformers: neither on disk nor on the hub, or the hub unreachable
        first = str(e).splitlines()[0]
        unreachable = "connect" in first.lower() or "offline" in first.lower()
        kind = StorageTrouble if unreachable else ConfigError
        raise kind(f"data.tokenizer: cannot load {data.tokenizer!r} ({first})") from None


def _listed(repo: DatasetRepo, name, split: str) -> list[RepoFile]:
    try:
        return repo.files(name, split)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the hub's or the bucket's errors: storage trouble, named
        raise StorageTrouble(f"{repo.field}.id: cannot list {repo.dataset_id!r} ({type(e).__name__}: {e})") from e


def dry_run(data, splits: list[HubSplit], options: PretokenizeOptions) -> Iterator[str]:
    from levanter_mars.pretokenize.estimate import cpus_of, describe, sample

    cpus = cpus_of(options.estimate_for)
    for split in splits:
        if not split.files:
            yield f"{split.source.field}: no {split.source.split} files (config {split.source.name or 'default'})"
            continue
        source = split.source
        measured = sample(source.repo, split.files[0], source.processor, source.text_key, source.field)
        yield from describe(source.field, source.repo, source.name, source.split, split.files, measured, cpus)
        yield f"  cache: {source.split_dir}; mirror: {source.mirror_dir}"
    for field, component in data_sources.data_sources(data):
        if getattr(component, "id", None) is None:
            for split in data_sources.SPLITS:
                urls = getattr(component, f"{split}_urls", None) or []
                if urls:
                    yield f"{field}: {len(urls)} {split} URL(s), tokenized serially ({urls[0]}{', ...' if len(urls) > 1 else ''})"


def check_missing_files(data) -> None:
    problems = data_sources.missing_data_paths(data)
    if problems:
        raise ConfigError("; ".join(problems))


def check_caches(data, splits: list[HubSplit], options: PretokenizeOptions) -> None:
    """Write probes of every cache and mirror directory, then the caches' provenance records (a cache built from other
    data is refused), before anything is copied."""
    from levanter_mars.training.checkpointing.storage import check_writable
    from levanter_mars.training.errors import CheckpointError, StoragePathError

    built = [s.source for s in splits if s.files]
    targets = [(s.split_dir, "data.cache_dir", "token caches") for s in built]
    targets += [(s.mirror_dir, "--mirror_dir" if options.mirror_dir else "data.cache_dir", "mirrored files")
                for s in built]  # fmt: skip
    for directory, field, what in dict.fromkeys(targets):
        try:
            check_writable(directory, field=field, what=what)
        except StoragePathError as e:
            raise CachePathError(str(e)) from None
        except CheckpointError as e:
            raise StorageTrouble(str(e)) from None
    cache_check.check_and_prepare(data)


def build_hub_splits(splits: list[HubSplit], options: PretokenizeOptions,
                     report: Callable[[str], None]) -> dict[str, dict]:  # fmt: skip
    """Every split with files, built; one executor for all, started only when a unit is left to tokenize."""
    from levanter_mars.pretokenize.executors import executor

    records: dict[str, dict] = {}
    runner: list = []

    def units_executor():
        if not runner:
            runner.append(executor(options.serial, options.address, options.workers))
        return runner[0]

    leases: dict = {}
    try:
        for split in splits:
            if not split.files:
                _mark_absent(split.source)
                continue
            lease = leases.get(split.source.field) or leases.setdefault(split.source.field, _build_lease(split.source))
            records[split.source.split_dir] = build_split(split.source, split.files, options, units_executor, report,
                                                          still_mine=lease.check)  # fmt: skip
    finally:
        if runner:
            runner[0].close()
        for lease in leases.values():
            lease.release()
    return records


def _build_lease(source) -> "object":
    """One data step builds a source at a time: a second is refused (exit 8) before it writes anything, and the
    first stops at its next unit if one took the build over (``training/run/lease.py``'s atomic lease)."""
    from levanter_mars.training.run.lease import RunLease

    root = source.split_dir.rstrip("/").rsplit("/", 1)[0]
    lease = RunLease.acquire(join(root, "build.lease.json"), f"the data step of {source.field}")
    lease.start_renewing()
    return lease


def _mark_absent(source: SplitSource) -> None:
    """Training then knows the split is not there without asking the hub (``training/data/cached_first.py``)."""
    import json

    from levanter_mars.training.data.cached_first import ABSENT_SPLIT
    from levanter_mars.training.whole_files import write_whole

    reason = f"config {source.name or 'default'!r} of {source.repo.dataset_id!r} has no {source.split} files"
    write_whole(join(source.split_dir, ABSENT_SPLIT), json.dumps({"field": source.field, "reason": reason}) + "\n")


def build_url_sources(data) -> list[str]:
    return data_sources.build_local_caches(data, remote=True)


def summary(data) -> Iterator[str]:
    """A line per cache the config uses: ``train (data.configs.x): N documents in DIR``."""
    from levanter_mars.pretokenize.assemble import read_ledger
    from levanter_mars.training.data.cached_first import ABSENT_SPLIT
    from levanter_mars.training.whole_files import read_whole

    for field, _, split, split_dir in cache_check.cache_splits(data):
        ledger = read_ledger(split_dir)
        if ledger is not None and ledger.is_finished:
            yield f"{split} ({field}): {ledger.total_num_rows:,} documents in {split_dir}"
        elif read_whole(join(split_dir, ABSENT_SPLIT)) is not None:
            yield f"{split} ({field}): none, the dataset has no {split} files"
