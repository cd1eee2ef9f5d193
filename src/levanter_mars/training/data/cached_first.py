"""Finished caches load without their source (compat defect 47).

Levanter opens a source before it looks for its finished cache: ``LMMixtureDatasetConfig.build_caches`` calls
``get_shard_source(split)`` for every source first, and for a dataset id that is ``datasets.load_dataset`` (the hub),
so every training start on every host contacts the hub, and a run whose tokens are all cached cannot start while the
hub is unreachable. ``LMTaskConfig.build_or_load_cache`` (a single dataset id) does the same, and the split a dataset
does not have (FineWeb-Edu has no validation split) is found missing only by asking the hub.

:func:`finished_caches_first` loads every finished cache as Levanter's own loader does, skips a split the data step
found absent (``ABSENT_SPLIT`` in its cache directory), and hands only the rest to Levanter.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Mapping

import fsspec
from levanter.data.text import LMMixtureDatasetConfig, load_lm_dataset_cache

#: Written by the data step into ``<cache>/<split>`` when the dataset has no files for that split.
ABSENT_SPLIT = "absent.json"


def _exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def finished(split_dir: str) -> bool:
    try:
        with fsspec.open(os.path.join(split_dir, "shard_ledger.json"), "r") as f:
            return bool(json.load(f).get("is_finished"))
    except (FileNotFoundError, ValueError):
        return False


def _trained_on(config: LMMixtureDatasetConfig, name: str) -> bool:
    weights = config.train_weights
    stages = [weights] if isinstance(weights, dict) else [stage for _, stage in weights]
    return any(stage.get(name, 0) > 0 for stage in stages)


def _cache_root(config, name: str, source) -> str | None:
    """Where Levanter's ``build_caches`` puts a source's caches: its own ``cache_dir``, else ``<cache_dir>/<name>``
    (a mixture's source), or the config's ``cache_dir`` (a single dataset)."""
    if not isinstance(config, LMMixtureDatasetConfig):
        return config.cache_dir
    return source.cache_dir or (os.path.join(config.cache_dir, name) if config.cache_dir else None)


def cached(config, name: str, source, split: str):
    """``("finished", cache)``, ``("absent", None)`` (the data step found no files for the split) or
    ``("levanter", None)``: build or load it as Levanter does."""
    root = _cache_root(config, name, source)
    split_dir = os.path.join(root, split) if root else None
    if split_dir and finished(split_dir):
        return "finished", load_lm_dataset_cache(split_dir, source.format, config.the_tokenizer, config.enforce_eos)
    if split_dir and _exists(os.path.join(split_dir, ABSENT_SPLIT)):
        return "absent", None
    return "levanter", None


def finished_caches_first(config: LMMixtureDatasetConfig, split: str,
                          upstream: Callable[[Mapping[str, object]], dict]) -> dict:  # fmt: skip
    """A mixture's caches of ``split`` by source name: finished ones loaded, absent ones skipped, the rest from
    ``upstream(sources)`` (Levanter's ``build_caches`` for those sources only)."""
    caches, rest = {}, {}
    for name, source in config.configs.items():
        if split == "train" and not _trained_on(config, name):
            continue  # Levanter neither builds nor loads it
        state, cache = cached(config, name, source, split)
        if state == "finished":
            caches[name] = cache
        elif state == "levanter":
            rest[name] = source
    if rest:
        caches.update(upstream(rest))
    return caches


def restricted(config: LMMixtureDatasetConfig, names) -> LMMixtureDatasetConfig:
    """The mixture with only the sources ``names`` (and their weights, every stage)."""
    names = set(names)
    weights = config.train_weights
    if isinstance(weights, dict):
        weights = {k: v for k, v in weights.items() if k in names}
    else:
        weights = [(step, {k: v for k, v in stage.items() if k in names}) for step, stage in weights]
    return dataclasses.replace(config, configs={k: v for k, v in config.configs.items() if k in names},
                               train_weights=weights)  # fmt: skip
