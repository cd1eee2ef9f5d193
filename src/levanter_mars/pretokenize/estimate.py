"""The dry run's numbers: what a source holds and how long tokenizing it takes on a given set of CPUs, from the
dataset's listing and one sample, before anything is copied or built.

The sample is the first row group of the first file (a ranged read: its footer, then that row group's columns). It
gives the tokens per stored byte (the whole row group's compressed bytes, all columns, as the listing counts files),
the rate of the build's own tokenizing (Levanter's processor, one thread) on this machine, and the bytes a token
takes in Levanter's cache format (the sample written to a temporary local cache). Tokens are estimated
as the listed bytes times that ratio; hours as those tokens over the rate times the CPUs named (a vCPU counted as a
core: hyperthread pairs share one, so a host's vCPUs give less than that many cores).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

import pyarrow.parquet as pq

from levanter_mars.pretokenize.dataset_repo import DatasetRepo, RepoFile
from levanter_mars.pretokenize.errors import SourceError
from levanter_mars.pretokenize.units import check_text_column
from levanter_mars.pretokenize.worker import WORKER_ENVIRONMENT
from levanter_mars.training.config import ConfigError

#: Documents of the sample at most (and at least what one row group holds up to this).
SAMPLE_DOCUMENTS = 2000


@dataclass(frozen=True)
class Sample:
    documents: int
    characters: int
    tokens: int
    compressed_bytes: int
    seconds: float
    cache_bytes: int
    """What the sample's tokens take in Levanter's cache format (int64, blosc-compressed), written here to measure."""

    @property
    def tokens_per_byte(self) -> float:
        return self.tokens / max(self.compressed_bytes, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def cache_bytes_per_token(self) -> float:
        return self.cache_bytes / max(self.tokens, 1)


@dataclass(frozen=True)
class Cpus:
    count: int
    described: str


def cpus_of(target: str) -> Cpus:
    """``v4-32`` (its hosts' vCPUs), ``n2-standard-32`` (a GCE machine type's vCPUs, its last number) or ``64``."""
    target = str(target).strip()
    if target.isdigit() and int(target) > 0:
        return Cpus(int(target), f"{target} CPUs")
    if target.startswith(("n1-", "n2-", "n2d-", "c2-", "c3-", "e2-", "c2d-", "n4-")):
        count = target.rsplit("-", 1)[-1]
        if count.isdigit():
            return Cpus(int(count), f"{target} ({count} vCPUs)")
    from levanter_mars.infra.config import LaunchError, canonical_tpu_type
    from levanter_mars.infra.slices import GENERATIONS, slice_type

    try:
        kind = slice_type(canonical_tpu_type(target))
    except LaunchError as e:
        raise ConfigError(f"--estimate_for: {e}; or a GCE machine type (n2-standard-32) or a number of CPUs") from None
    per_host = GENERATIONS[kind.generation].vcpus_per_host
    return Cpus(kind.hosts * per_host, f"{target}'s {kind.hosts} host(s) x {per_host} vCPUs")


def sample(repo: DatasetRepo, file: RepoFile, processor, text_key: str, field: str) -> Sample:
    for name, value in WORKER_ENVIRONMENT.items():
        os.environ[name] = value
    url = repo.url(file.path)
    try:
        with repo.open(file.path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            check_text_column(parquet, url, text_key, field)
            if parquet.metadata.num_row_groups == 0:
                raise SourceError(f"{url}: empty (0 documents)")
            group = parquet.metadata.row_group(0)
            texts = parquet.read_row_group(0, columns=[text_key]).column(0).to_pylist()
    except (OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise SourceError(f"{url}: not a readable parquet file, corrupt or truncated ({e})") from None
    texts = [t for t in texts[:SAMPLE_DOCUMENTS] if t is not None]
    compressed = sum(group.column(i).total_compressed_size for i in range(group.num_columns))
    share = len(texts) / max(group.num_rows, 1)
    start = time.perf_counter()
    encoded = processor([{text_key: t} for t in texts])
    seconds = time.perf_counter() - start
    tokens = sum(len(d["input_ids"]) for d in encoded)
    return Sample(len(texts), sum(map(len, texts)), tokens, int(compressed * share), seconds,
                  _stored_bytes(processor, encoded))  # fmt: skip


def _stored_bytes(processor, encoded: list) -> int:
    """Bytes on disk of ``encoded`` written as Levanter's builder writes a cache (a temporary local one)."""
    import tempfile

    import numpy as np
    from levanter.store.jagged_array import PreparedBatch
    from levanter.store.tree_store import TreeStore

    with tempfile.TemporaryDirectory(prefix="pretokenize-estimate-") as directory:
        exemplar = processor.output_exemplar
        store = TreeStore.open(exemplar, directory, mode="w", cache_metadata=False)
        rows = [np.asarray(d["input_ids"], dtype=np.asarray(exemplar["input_ids"]).dtype) for d in encoded]
        store.tree["input_ids"].extend(PreparedBatch.from_batch(rows))
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(directory) for f in names)


def describe(field: str, repo: DatasetRepo, name, split: str, files: Sequence[RepoFile], measured: Sample,
             cpus: Cpus) -> list[str]:  # fmt: skip
    total = sum(f.size for f in files)
    tokens = total * measured.tokens_per_byte
    hours = tokens / (measured.tokens_per_second * cpus.count) / 3600
    first, last = files[0].path, files[-1].path
    return [
        f"{field}: {repo.dataset_id} (config {name or 'default'}, split {split}) at {repo.url('')}",
        f"  files: {len(files)} ({first}{' ... ' + last if len(files) > 1 else ''}), {total / 1e9:.3f} GB",
        f"  sample: {measured.documents} documents of {first} ({measured.characters / 1e6:.2f}M characters, "
        f"{measured.tokens:,} tokens: {measured.tokens_per_byte:.3f} tokens per stored byte)",
        f"  tokens (estimate): {tokens / 1e9:.3f}B",
        f"  tokenizing here: {measured.tokens_per_second / 1e6:.3f}M tokens/s on one core (the build's processor, "
        "one thread)",
        f"  on {cpus.described}: {hours:.2f} h to tokenize ({hours * 60:.1f} min) at that rate per CPU; the mirror "
        f"copies {total / 1e9:.3f} GB first, and the cache takes about "
        f"{tokens * measured.cache_bytes_per_token / 1e9:.2f} GB ({measured.cache_bytes_per_token:.2f} bytes a token "
        "in Levanter's format, measured on the sample), written by the one driver",
    ]
