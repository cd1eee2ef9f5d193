"""Levanter's data configs with one field more, ``rebuild_cache``, so that ``--data.rebuild_cache true`` parses.

``data`` stays a plain union of the three Levanter shapes (a list of URLs, an HF dataset, a mixture): draccus tries
them in this order, exactly as it does for Levanter's own ``TrainLmConfig``. Everything that checks
``isinstance(data, LMMixtureDatasetConfig)`` (ours and Levanter's) still sees the Levanter class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from levanter.data.text import HfSingleDatasetLMConfig, LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

from levanter_mars.training.data.cached_first import cached, finished_caches_first, restricted


@dataclass(frozen=True)
class RebuildCacheField:
    rebuild_cache: bool = False
    """Move token caches whose provenance record differs from this config (or that have none) aside, never deleting
    them, and build new ones. Caches that match their record are kept, so a restarted job does not rebuild again."""


@dataclass(frozen=True)
class UrlDataConfig(UrlSingleDatasetLMConfig, RebuildCacheField):
    pass


@dataclass(frozen=True)
class HfDataConfig(HfSingleDatasetLMConfig, RebuildCacheField):
    def build_or_load_cache(self, split: str, monitors=True):
        """A finished cache loads without opening the dataset; an absent split is None (``cached_first``, compat
        defect 47). Levanter's ``train_set``, ``validation_set`` and ``build_caches`` all come here."""
        state, cache = cached(self, "", self, split)
        if state == "levanter":
            return HfSingleDatasetLMConfig.build_or_load_cache(self, split, monitors)
        return cache


@dataclass(frozen=True)
class MixtureDataConfig(LMMixtureDatasetConfig, RebuildCacheField):
    def build_caches(self, split: str, monitors=True):
        """Finished caches load without opening their sources (``cached_first``, compat defect 47)."""
        return finished_caches_first(
            self, split, lambda rest: LMMixtureDatasetConfig.build_caches(restricted(self, rest), split, monitors))


DataConfig = Union[UrlDataConfig, HfDataConfig, MixtureDataConfig]
