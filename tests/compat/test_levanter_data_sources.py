"""Defect 47: Levanter's ``build_caches`` opens a dataset id's source (``datasets.load_dataset``, the hub) before it
looks for the finished cache; ``training/data/cached_first.py`` loads finished caches first and skips a split the data
step found absent. The hub is replaced by a ``load_dataset`` that fails, as it does offline."""

import dataclasses

import numpy as np
import pytest
import yaml
from levanter.data.text import LMMixtureDatasetConfig, preprocessor_for_format
from levanter.store.cache import CacheMetadata, SerialCacheWriter

from levanter_mars.program_config import parse_train_config
from levanter_mars.training.data.cached_first import ABSENT_SPLIT
from tests.helpers.first_mile import hub_config

HUB_ID = "HuggingFaceFW/fineweb-edu"


class HubReached(RuntimeError):
    pass


@pytest.fixture
def offline_hub(monkeypatch):
    import datasets

    def load_dataset(*args, **kwargs):
        raise HubReached(f"load_dataset{args}")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def _cached(tmp_path, corpus):
    """A config reading the hub's FineWeb-Edu, its train cache finished (a few documents), its validation absent."""
    config = parse_train_config(["--config_path", str(hub_config(tmp_path, corpus, HUB_ID))])
    data = config.data
    processor = preprocessor_for_format(data.configs["fineweb_edu"].format, data.the_tokenizer, enforce_bos=True,
                                        enforce_eos=data.enforce_eos)  # fmt: skip
    split_dir = tmp_path / "cache" / "fineweb_edu" / "train"
    with SerialCacheWriter(str(split_dir), processor.output_exemplar,
                           metadata=CacheMetadata(preprocessor_metadata=processor.metadata)) as writer:  # fmt: skip
        writer.write_batch(processor([{"text": f"document {i} of the cache"} for i in range(5)]))
    (tmp_path / "cache" / "fineweb_edu" / "validation").mkdir(parents=True)
    (tmp_path / "cache" / "fineweb_edu" / "validation" / ABSENT_SPLIT).write_text("{}")
    return data


def test_defect_47_levanter_opens_the_hub_for_a_finished_cache_and_the_workaround_does_not(tmp_path, pydocs_corpus,
                                                                                         offline_hub):  # fmt: skip
    data = _cached(tmp_path, pydocs_corpus)
    with pytest.raises(HubReached):
        LMMixtureDatasetConfig.build_caches(data, "train")
    caches = data.build_caches("train")
    assert list(caches) == ["fineweb_edu"] and len(caches["fineweb_edu"]) == 5
    first = np.asarray(caches["fineweb_edu"][0]["input_ids"])
    assert len(first) > 3
    assert data.build_caches("validation") == {}  # absent: nothing asked of the hub


def test_a_source_without_a_finished_cache_still_goes_to_levanter(tmp_path, pydocs_corpus, offline_hub):
    data = _cached(tmp_path, pydocs_corpus)
    (tmp_path / "cache" / "fineweb_edu" / "validation" / ABSENT_SPLIT).unlink()
    with pytest.raises(HubReached):
        data.build_caches("validation")
    unweighted = dataclasses.replace(data, train_weights={"fineweb_edu": 0.0})
    assert unweighted.build_caches("train") == {}  # Levanter neither builds nor loads an unweighted train cache


def test_a_single_dataset_config_loads_its_finished_cache_without_the_hub_too(tmp_path, pydocs_corpus, offline_hub):
    """``data: {id: ..., name: ...}`` (no mixture): Levanter's train_set and validation_set go through
    ``build_or_load_cache``, which opens the source first as ``build_caches`` does."""
    from levanter.data.text import HfSingleDatasetLMConfig

    config_path = hub_config(tmp_path, pydocs_corpus, HUB_ID)
    raw = yaml.safe_load(config_path.read_text())
    raw["data"] = {"id": HUB_ID, "name": "sample-100BT", "cache_dir": str(tmp_path / "single"),
                   "tokenizer": str(pydocs_corpus / "tokenizer")}  # fmt: skip
    config_path.write_text(yaml.safe_dump(raw))
    data = parse_train_config(["--config_path", str(config_path)]).data
    processor = preprocessor_for_format(data.format, data.the_tokenizer, enforce_bos=True,
                                        enforce_eos=data.enforce_eos)  # fmt: skip
    with SerialCacheWriter(str(tmp_path / "single" / "train"), processor.output_exemplar,
                           metadata=CacheMetadata(preprocessor_metadata=processor.metadata)) as writer:  # fmt: skip
        writer.write_batch(processor([{"text": f"document {i}"} for i in range(3)]))
    (tmp_path / "single" / "validation").mkdir()
    (tmp_path / "single" / "validation" / ABSENT_SPLIT).write_text("{}")
    with pytest.raises(HubReached):
        HfSingleDatasetLMConfig.build_or_load_cache(data, "train")
    assert len(data.build_or_load_cache("train")) == 3
    assert data.build_or_load_cache("validation") is None
    assert list(data.build_caches("train")) == [""]
