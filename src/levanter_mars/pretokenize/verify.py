"""The check that a finished cache holds exactly the source's documents, tokenized, before it is marked finished.

Read through Levanter's own reader (``TreeStore`` opened read-only, as ``TreeCache`` reads it), not the code that
wrote it:

* **counts**: each unit's rows in the ledger equal the rows its parquet footer lists, and the cache's rows are their
  sum (no document lost or repeated);
* **digests**: each unit's slice of the cache hashes (``worker.unit_digest``: every document's length, then its
  tokens) to the digest its worker computed from the tokens it produced;
* **documents**: ``samples`` documents of each unit (its first, its last, and seeded picks; or every one with
  ``all_documents``) read again from the mirrored file and tokenized again here equal their rows in the cache.

The result, per unit, goes to ``verification.json`` beside the cache. A unit that fails is cut from the cache (with
every unit after it), so that a rerun appends it again from its tokenized files.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from levanter_mars.pretokenize.units import Unit, open_parquet
from levanter_mars.pretokenize.worker import UnitResult, unit_digest

#: Tokens read from the cache at a time while hashing a unit.
READ_TOKENS = 16 << 20


class VerificationFailed(RuntimeError):
    def __init__(self, message: str, unit_index: int):
        super().__init__(message)
        self.unit_index = unit_index


@dataclass(frozen=True)
class Verified:
    rows: int
    tokens: int
    sampled_documents: int
    per_unit: list[dict]


def verify(split_dir: str, processor, units: Sequence[Unit], results: Mapping[str, UnitResult], *, text_key: str,
           samples: int = 3, all_documents: bool = False, seed: int = 0) -> Verified:  # fmt: skip
    from levanter.store.tree_store import TreeStore

    from levanter_mars.pretokenize.assemble import read_ledger

    store = TreeStore.open(processor.output_exemplar, split_dir, mode="r", cache_metadata=False)
    array = store.tree["input_ids"]
    ledger = read_ledger(split_dir)
    rng = random.Random(seed)
    per_unit, row, sampled, tokens = [], 0, 0, 0
    for index, unit in enumerate(units):
        result = results.get(unit.name)
        if result is None:
            raise VerificationFailed(f"unit {unit.name} ({unit.file}) is in the cache, and the record of its "
                                     "tokenizing (its done marker) is gone", index)  # fmt: skip
        recorded = ledger.shard_rows.get(unit.name)
        if recorded != unit.rows or result.rows != unit.rows:
            raise VerificationFailed(f"unit {unit.name} ({unit.file}): {recorded} rows in the ledger, {result.rows} "
                                     f"tokenized, {unit.rows} in the footer", index)  # fmt: skip
        digest, unit_tokens = _digest_of_rows(array, row, row + unit.rows)
        if digest != result.sha256:
            raise VerificationFailed(f"unit {unit.name} ({unit.file}): rows {row}-{row + unit.rows - 1} of the cache "
                                     f"hash to {digest[:16]}, its worker wrote {result.sha256[:16]}", index)  # fmt: skip
        picks = range(unit.rows) if all_documents else _picks(unit.rows, samples, rng)
        for offset, text in _documents(unit, text_key, picks):
            expected = np.asarray(processor([{text_key: text}])[0]["input_ids"])
            stored = np.asarray(array[row + offset])
            if not np.array_equal(expected, stored):
                raise VerificationFailed(f"unit {unit.name} ({unit.file}): document {offset} tokenizes to "
                                         f"{len(expected)} tokens and the cache's row {row + offset} holds "
                                         f"{_how_it_differs(expected, stored)}", index)  # fmt: skip
            sampled += 1
        per_unit.append({"unit": unit.name, "file": unit.file, "row_groups": [unit.first_row_group,
                         unit.stop_row_group], "rows": unit.rows, "first_row": row, "tokens": unit_tokens,
                         "sha256": digest, "sampled_documents": len(picks)})  # fmt: skip
        row += unit.rows
        tokens += unit_tokens
    if ledger.total_num_rows != row or array.num_rows != row:
        raise VerificationFailed(f"{split_dir}: {array.num_rows} rows in the cache, {ledger.total_num_rows} in the ledger,"
                                 f" {row} in the sources", len(units) - 1)  # fmt: skip
    return Verified(row, tokens, sampled, per_unit)


def _how_it_differs(expected: np.ndarray, stored: np.ndarray) -> str:
    if len(expected) != len(stored):
        return f"{len(stored)}"
    first = int(np.argmax(expected != stored))
    return f"as many, which differ from token {first} on ({stored[first]} for {expected[first]})"


def _digest_of_rows(array, start: int, stop: int) -> tuple[str, int]:
    """The unit digest of rows ``[start, stop)`` of a Levanter jagged array, read a slice at a time."""
    ends = np.asarray(array.offsets[start + 1 : stop + 1].read().result(), dtype=np.int64)
    first = 0 if start == 0 else int(array.offsets[start].read().result())
    lengths = np.diff(np.concatenate([[first], ends]))
    lengths_digest, tokens_digest = hashlib.sha256(lengths.astype("<i8").tobytes()), hashlib.sha256()
    position, end = first, int(ends[-1]) if len(ends) else first
    while position < end:
        upto = min(end, position + READ_TOKENS)
        tokens_digest.update(np.asarray(array.data[position:upto].read().result()).astype("<i4").tobytes())
        position = upto
    return unit_digest(lengths_digest, tokens_digest), end - first


def _picks(rows: int, samples: int, rng: random.Random) -> list[int]:
    """The unit's first and last documents, then seeded picks: ``samples`` in all (at most every one)."""
    wanted = min(rows, max(samples, 0))
    chosen = set([0, rows - 1][:wanted])
    while len(chosen) < wanted:
        chosen.add(rng.randrange(rows))
    return sorted(chosen)


def _documents(unit: Unit, text_key: str, offsets) -> list[tuple[int, str]]:
    """(offset in the unit, text) of the unit's documents at ``offsets``, read from the mirrored file."""
    wanted = sorted(set(offsets))
    if not wanted:
        return []
    parquet: pq.ParquetFile = open_parquet(unit.file)
    out, row = [], 0
    for group in range(unit.first_row_group, unit.stop_row_group):
        size = parquet.metadata.row_group(group).num_rows
        inside = [o for o in wanted if row <= o < row + size]
        if inside:
            texts = parquet.read_row_group(group, columns=[text_key]).column(0)
            out += [(o, texts[o - row].as_py()) for o in inside]
        row += size
    return out
