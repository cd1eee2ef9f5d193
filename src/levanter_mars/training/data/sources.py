"""Local data helpers: path checks that name the field, and token caches built without Ray.

Levanter builds token caches with Ray actors. That costs a Ray start-up and, on a 2-CPU machine, a cache actor can
deadlock waiting for a CPU. For local sources we build the identical cache (same processor, same metadata) in this
process with Levanter's ``SerialCacheWriter``, wherever the cache lives (a local directory or gs://); Levanter then
finds and loads it. Remote sources (gs://, hf://, an HF dataset id) are left to Levanter, or to
``scripts/pretokenize.py``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import urllib.parse
from typing import Iterable, Iterator

import braceexpand
from levanter.data.text import (
    LMMixtureDatasetConfig,
    UrlSingleDatasetLMConfig,
    preprocessor_for_format,
)
from levanter.store.cache import CacheMetadata, SerialCacheWriter, TreeCache

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
_BATCH = 128


def is_local(url: str) -> bool:
    scheme = urllib.parse.urlparse(url).scheme
    return scheme in ("", "file")


def _local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def expand_local(url: str) -> list[str]:
    """Brace- and glob-expanded local paths of a data URL."""
    paths: list[str] = []
    for pattern in braceexpand.braceexpand(_local_path(url)):
        paths.extend(sorted(glob.glob(os.path.expanduser(pattern))) or [])
    return paths


def data_sources(data) -> Iterator[tuple[str, UrlSingleDatasetLMConfig | object]]:
    """(config field, source config) of each data source: ``data`` itself, or ``data.configs.<name>``."""
    if isinstance(data, LMMixtureDatasetConfig):
        for name, component in data.configs.items():
            yield f"data.configs.{name}", component
    else:
        yield "data", data


def component_cache_dir(data, component, name: str) -> str | None:
    """Where Levanter puts the caches of one source: its own cache_dir, else ``data.cache_dir[/<name>]``."""
    if getattr(component, "cache_dir", None):
        return component.cache_dir
    if isinstance(data, LMMixtureDatasetConfig) and data.cache_dir:
        return os.path.join(data.cache_dir, name.rsplit(".", 1)[-1])
    return getattr(data, "cache_dir", None)


def cache_exists(cache_dir: str | None, split: str) -> bool:
    if not cache_dir:
        return False
    ledger = os.path.join(cache_dir, split, "shard_ledger.json")
    if is_local(cache_dir):
        return os.path.exists(_local_path(ledger))
    import fsspec

    return fsspec.core.url_to_fs(ledger)[0].exists(ledger)


def missing_data_paths(data, *, offline: bool = False, skipped: list[str] | None = None) -> list[str]:
    """Messages for local data files that do not exist and have no token cache to fall back on. ``offline``: a token
    cache in a bucket is not looked at, and the files it could stand for are noted in ``skipped``."""
    problems = []
    for name, component in data_sources(data):
        for split in SPLITS:
            urls: Iterable[str] = getattr(component, f"{split}_urls", None) or ()
            missing = [(i, url) for i, url in enumerate(urls) if is_local(url) and not expand_local(url)]
            cache_dir = component_cache_dir(data, component, name)
            if missing and offline and cache_dir and not is_local(cache_dir):
                if skipped is not None:
                    skipped.append(f"{name}.{split}_urls (missing here; a token cache in {cache_dir} may stand in)")
                continue
            if missing and cache_exists(cache_dir, split):
                # Legitimate (the raw files may be deleted once tokenized), but the cache, not the URLs, is used.
                logger.warning(
                    "%s.%s_urls: %s missing; training on the existing token cache %s, built from earlier files",
                    name, split, ", ".join(repr(url) for _, url in missing), os.path.join(cache_dir, split),
                )
                continue
            problems.extend(f"{name}.{split}_urls[{i}]: no such file {url!r}" for i, url in missing)
    return problems


def _has_a_document(path: str) -> bool:
    """Whether a local text/jsonl file holds anything but whitespace (read until the first other character)."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return True
    return False


def _finished_cache_rows(cache_dir: str, split: str) -> int | None:
    """Rows of a finished local token cache (None when unknown: remote, unfinished or unreadable)."""
    ledger = os.path.join(_local_path(cache_dir), split, "shard_ledger.json")
    try:
        with open(ledger) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return int(record["total_num_rows"]) if record.get("is_finished") and "total_num_rows" in record else None


def empty_data_paths(data) -> list[str]:
    """Messages for splits with nothing to train or evaluate on: every local file of a split empty, or a finished
    local token cache of no rows. Levanter would fail on them only after compiling, with an IndexError (validation)
    or "Requested indices beyond the end of the dataset" (train)."""
    problems = []
    for name, component in data_sources(data):
        cache_dir = component_cache_dir(data, component, name)
        for split in SPLITS:
            field = f"{name}.{split}_urls"
            urls = list(getattr(component, f"{split}_urls", None) or ())
            if cache_dir and is_local(cache_dir) and cache_exists(cache_dir, split):
                if _finished_cache_rows(cache_dir, split) == 0:
                    where = os.path.join(cache_dir, split)
                    problems.append(f"{field}: the token cache {where!r} has no documents (built from empty files?)")
                continue
            if not urls or not all(is_local(u) for u in urls):
                continue
            files = [path for url in urls for path in expand_local(url)]
            if files and not any(_has_a_document(path) for path in files):
                shown = ", ".join(repr(path) for path in files[:3]) + (", ..." if len(files) > 3 else "")
                problems.append(f"{field}: no documents to {'train' if split == 'train' else 'evaluate'} on: "
                                f"{shown} {'is' if len(files) == 1 else 'are'} empty")
    return problems


def build_local_caches(data, *, remote: bool = False) -> list[str]:
    """Builds missing token caches of local URL sources (with ``remote``, of bucket URLs too: the data step),
    serially (the cache itself may be on gs://). Returns the cache directories it built."""
    built = []
    for name, component in data_sources(data):
        if not isinstance(component, UrlSingleDatasetLMConfig) and not hasattr(component, "train_urls"):
            continue
        cache_dir = component_cache_dir(data, component, name)
        if not cache_dir:
            continue
        tokenizer = data.the_tokenizer if isinstance(data, LMMixtureDatasetConfig) else component.the_tokenizer
        for split in SPLITS:
            urls = getattr(component, f"{split}_urls", None) or []
            if not urls or not (remote or all(is_local(u) for u in urls)) or cache_exists(cache_dir, split):
                continue
            path = os.path.join(_local_path(cache_dir), split)
            build_cache_serially(component, tokenizer, split, path, enforce_eos=data.enforce_eos)
            built.append(path)
    return built


def build_cache_serially(component, tokenizer, split: str, cache_path: str, *, enforce_eos: bool) -> TreeCache:
    """The cache Levanter would build for ``component``'s ``split`` (``enforce_eos``: the data config's), written by
    this process alone."""
    source = component.get_shard_source(split)
    processor = preprocessor_for_format(component.format, tokenizer, enforce_bos=True, enforce_eos=enforce_eos)
    metadata = CacheMetadata(preprocessor_metadata=processor.metadata)
    logger.info("Tokenizing %s split into %s (serially, no Ray)", split, cache_path)
    with SerialCacheWriter(cache_path, processor.output_exemplar, metadata=metadata) as writer:
        for shard in source.shard_names:
            batch = []
            for document in source.open_shard(shard):
                batch.append(document)
                if len(batch) == _BATCH:
                    writer.write_batch(processor(batch))
                    batch = []
            if batch:
                writer.write_batch(processor(batch))
    return writer.result()
