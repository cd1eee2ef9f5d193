"""The data step's test material: a FineWeb-Edu stand-in made from the embedded corpus, a training config that reads it
as a dataset id, and the independent reference, the cache Levanter's own serial writer makes from the same config
(``datasets`` streaming the folder by config name, Levanter's processor, ``SerialCacheWriter``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from tests.helpers.training import tiny_config

CONFIG = "sample-100BT"
FIELD = "data.configs.fineweb_edu"


def make_standin(directory: Path, corpus: Path, *, files: int = 4, row_group_rows: int = 48,
                 documents: Optional[int] = 600) -> dict:  # fmt: skip
    from levanter_mars.pretokenize.standin import StandinConfig, documents as read_documents, write_standin

    texts = read_documents(str(corpus / "train.jsonl"), documents)
    configs = (StandinConfig("sample-10BT", "sample/10BT", 1), StandinConfig(CONFIG, "sample/100BT", files))
    return write_standin(str(directory), texts, configs, row_group_rows)


def copy_standin(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def standin_files(folder: Path) -> list[Path]:
    return sorted((folder / "sample" / "100BT").glob("*.parquet"))


def hub_config(workdir: Path, corpus: Path, dataset_id: str, run_id: str = "firstmile", *, name: str = CONFIG,
               cache_dir: Optional[str] = None, trainer: Optional[dict] = None) -> Path:  # fmt: skip
    """The tiny training config with its data a one-source mixture reading ``dataset_id`` (FineWeb-Edu's shape:
    ``config/data/fineweb_edu.yaml``), tokenized with the corpus's tokenizer."""
    path = tiny_config(workdir, corpus, run_id, {"trainer": trainer or {}})
    config = yaml.safe_load(path.read_text())
    config.pop("embedded_corpus", None)
    config.pop("epoch", None)  # Levanter trains a mixture without epochs
    config["data"] = {
        "cache_dir": cache_dir or str(workdir / "cache"),
        "tokenizer": str(corpus / "tokenizer"),
        "configs": {"fineweb_edu": {"id": dataset_id, "name": name, "stream": True}},
        "train_weights": {"fineweb_edu": 1.0},
        "num_validation_sequences": {"fineweb_edu": 16},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def levanter_reference(config_path: Path, cache_path: Path) -> Path:
    """The train cache Levanter's own serial writer builds from the config's source (no code of the data step)."""
    from levanter.data.text import preprocessor_for_format
    from levanter.store.cache import CacheMetadata, SerialCacheWriter

    from levanter_mars.program_config import parse_train_config

    data = parse_train_config(["--config_path", str(config_path)]).data
    component = data.configs["fineweb_edu"]
    source = component.get_shard_source("train")
    processor = preprocessor_for_format(component.format, data.the_tokenizer, enforce_bos=True,
                                        enforce_eos=data.enforce_eos)  # fmt: skip
    with SerialCacheWriter(str(cache_path), processor.output_exemplar,
                           metadata=CacheMetadata(preprocessor_metadata=processor.metadata)) as writer:  # fmt: skip
        for shard in source.shard_names:
            batch = []
            for document in source.open_shard(shard):
                batch.append(document)
                if len(batch) == 64:
                    writer.write_batch(processor(batch))
                    batch = []
            if batch:
                writer.write_batch(processor(batch))
    return cache_path


def cache_arrays(split_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, tokens) of a finished cache, read through Levanter's loader."""
    from levanter.store.cache import TreeCache

    cache = TreeCache.load(str(split_dir), {"input_ids": np.zeros(1, dtype=np.int64)})
    array = cache.store.tree["input_ids"]
    rows = array.num_rows
    offsets = np.asarray(array.offsets[1 : rows + 1].read().result())
    tokens = np.asarray(array.data[0 : int(offsets[-1])].read().result())
    return offsets, tokens
