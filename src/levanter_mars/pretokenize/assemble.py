"""The split's cache, in Levanter's format, assembled from finished units in plan order as they come in.

The cache is what Levanter's builder writes and its loader reads: a ``TreeStore`` of the processor's exemplar (one
jagged array per field) and ``shard_ledger.json`` (a ``CacheLedger``: rows per unit in ``shard_rows``, the appended
units in ``finished_shards``, ``is_finished`` once all are in). A unit is appended only once every unit before it is,
and the ledger is rewritten whole after each: it is the only record of what the cache holds. Rows a killed assembler
appended past the ledger are cut off when it starts again, so a rerun continues from the ledger exactly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Mapping, Sequence

import fsspec
import numpy as np
from levanter.store.cache import LEDGER_FILE_NAME, CacheLedger, CacheMetadata
from levanter.store.jagged_array import PreparedBatch
from levanter.store.tree_store import TreeStore

from levanter_mars.pretokenize.units import Unit
from levanter_mars.training.config import ConfigError
from levanter_mars.pretokenize.worker import UnitResult, attempt_files
from levanter_mars.training.whole_files import read_whole, write_whole

logger = logging.getLogger(__name__)

FIELD = "input_ids"


def read_ledger(split_dir: str) -> CacheLedger | None:
    data = read_whole(f"{split_dir.rstrip('/')}/{LEDGER_FILE_NAME}")
    return None if data is None else CacheLedger.from_json(data.decode())  # type: ignore[attr-defined]


def write_ledger(split_dir: str, ledger: CacheLedger) -> None:
    write_whole(f"{split_dir.rstrip('/')}/{LEDGER_FILE_NAME}", ledger.to_json())  # type: ignore[attr-defined]


class Assembler:
    """Appends units to the cache at ``split_dir`` in the order of ``units``."""

    def __init__(self, split_dir: str, processor, units: Sequence[Unit], units_dir: str, flush_tokens: int = 8 << 20):
        exemplar = processor.output_exemplar
        if set(exemplar) != {FIELD}:
            raise ConfigError(f"data.tokenizer: {processor.name_or_path!r} returns {sorted(exemplar)}; the data step "
                              f"builds caches of {FIELD!r} alone (a language model's tokenizer)")  # fmt: skip
        self.split_dir = split_dir
        self.units = list(units)
        self.units_dir = units_dir
        self.flush_tokens = flush_tokens
        self.store = TreeStore.open(exemplar, split_dir, mode="a", cache_metadata=False)
        self.array = self.store.tree[FIELD]
        self.dtype = np.asarray(exemplar[FIELD]).dtype
        ledger = read_ledger(split_dir)
        if ledger is None:
            ledger = CacheLedger(total_num_rows=0, shard_rows={u.name: 0 for u in self.units}, is_finished=False,
                                 metadata=CacheMetadata(preprocessor_metadata=processor.metadata))  # fmt: skip
        expected = [u.name for u in self.units[: len(ledger.finished_shards)]]
        if ledger.finished_shards != expected:
            raise ValueError(f"{split_dir}: its ledger holds units {ledger.finished_shards[:3]}..., not the plan's "
                             f"first ones {expected[:3]}...: it was assembled from another plan")  # fmt: skip
        self.ledger = ledger
        if self.array.num_rows > ledger.total_num_rows:
            logger.warning("%s: cutting %d row(s) appended past the ledger by an assembler that was stopped", split_dir,
                        self.array.num_rows - ledger.total_num_rows)  # fmt: skip
            asyncio.run(self.array.trim_to_size_async(ledger.total_num_rows))

    @property
    def appended(self) -> int:
        return len(self.ledger.finished_shards)

    @property
    def finished(self) -> bool:
        return self.ledger.is_finished

    def append_ready(self, results: Mapping[str, UnitResult]) -> list[str]:
        """Appends every unit whose predecessors are in and whose result is in ``results``; returns their names."""
        done = []
        while self.appended < len(self.units) and self.units[self.appended].name in results:
            unit = self.units[self.appended]
            self._append(unit, results[unit.name])
            done.append(unit.name)
        return done

    def _append(self, unit: Unit, result: UnitResult) -> None:
        lengths_url, tokens_url = attempt_files(self.units_dir, unit.name, result.attempt)
        lengths = np.frombuffer(read_whole(lengths_url) or b"", dtype="<i8")
        if len(lengths) != result.rows or int(lengths.sum()) != result.tokens:
            raise ValueError(f"{lengths_url}: {len(lengths)} documents of {int(lengths.sum())} tokens, its marker "
                             f"says {result.rows} of {result.tokens}")  # fmt: skip
        with fsspec.open(tokens_url, "rb") as tokens_file:
            start = 0
            while start < len(lengths):
                stop = _rows_within(lengths, start, self.flush_tokens)
                count = int(lengths[start:stop].sum())
                data = np.frombuffer(tokens_file.read(4 * count), dtype="<i4")
                if len(data) != count:
                    raise ValueError(f"{tokens_url}: ends after {len(data)} of {count} tokens")
                offsets = np.cumsum(lengths[start:stop], dtype=np.int64)
                self.array.extend(PreparedBatch(data.astype(self.dtype), offsets, None))
                start = stop
        self.ledger.shard_rows[unit.name] = result.rows
        self.ledger.total_num_rows += result.rows
        self.ledger.finished_shards.append(unit.name)
        write_ledger(self.split_dir, self.ledger)

    def finish(self) -> CacheLedger:
        if self.appended != len(self.units):
            raise ValueError(f"{self.split_dir}: {self.appended} of {len(self.units)} units appended")
        self.ledger.is_finished = True
        write_ledger(self.split_dir, self.ledger)
        return self.ledger


def _rows_within(lengths: np.ndarray, start: int, budget: int) -> int:
    """The end of the run of rows from ``start`` holding at most ``budget`` tokens (at least one row)."""
    ends = np.cumsum(lengths[start:])
    return start + max(1, int(np.searchsorted(ends, budget, side="right")))


def remove_units(units_dir: str) -> None:
    fs, path = fsspec.core.url_to_fs(units_dir)
    if fs.exists(path):
        fs.rm(path, recursive=True)

