"""Tokenizing one unit: its documents read from the mirror, tokenized with Levanter's own processor (so the tokens are
the ones Levanter's builder would write), streamed to two flat files beside the cache, and a marker that says it is
done.

A unit's output is ``<units_dir>/<unit>/<attempt>/lengths.i64`` (each document's token count, int64 little-endian)
and ``tokens.i32`` (the documents' tokens, int32), each written whole, then ``<unit>/done-<attempt>.json``: rows,
tokens, characters and the unit's digest. The digest is ``sha256(sha256(lengths) + sha256(tokens))`` over those two
streams, independent of how the documents were batched, so ``verify`` recomputes it from the finished cache. A unit
with a done marker is never tokenized again; an attempt killed before its marker left nothing that counts (its files,
if any, are in its own attempt directory, removed when the build ends).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from levanter_mars.pretokenize.errors import SourceError, StorageTrouble
from levanter_mars.pretokenize.units import Unit, read_texts
from levanter_mars.training.whole_files import open_whole, read_json, write_whole

LENGTHS = "lengths.i64"
TOKENS = "tokens.i32"
#: One worker uses one core: the Rust tokenizer's own thread pool stays off (set before a worker loads it).
WORKER_ENVIRONMENT = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}


@dataclass(frozen=True)
class TokenizeJob:
    """What every unit of one split is tokenized with."""

    processor: object
    """Levanter's batch processor for the source's format and tokenizer (pickled to each worker once)."""
    text_key: str
    units_dir: str
    batch_rows: int = 1024
    flush_tokens: int = 4 << 20


@dataclass(frozen=True)
class UnitResult:
    unit: str
    attempt: str
    rows: int
    tokens: int
    characters: int
    sha256: str
    seconds: float
    host: str
    tokenized_now: bool = True
    """False when the unit was found done (no work)."""

    def to_json(self) -> dict:
        return asdict(self)


def unit_dir(units_dir: str, unit: str) -> str:
    return f"{units_dir.rstrip('/')}/{unit}"


def attempt_files(units_dir: str, unit: str, attempt: str) -> tuple[str, str]:
    base = f"{unit_dir(units_dir, unit)}/{attempt}"
    return f"{base}/{LENGTHS}", f"{base}/{TOKENS}"


def done_markers(units_dir: str, unit: str) -> list[dict]:
    """Every completion of ``unit`` (more than one: it was tokenized twice, which a build never does on purpose)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(unit_dir(units_dir, unit))
    try:
        names = sorted(n for n in fs.ls(path, detail=False) if os.path.basename(n).startswith("done-"))
    except FileNotFoundError:
        return []
    return [m for m in (read_json(fs.unstrip_protocol(n)) for n in names) if m is not None]


def completed(units_dir: str, unit: Unit) -> Optional[UnitResult]:
    """The unit's result if a worker finished it, from the very rows it is now (the same file, by its SHA-256, and
    row groups): a marker of a unit of an earlier plan, from other files, is not this unit's."""
    markers = [m for m in done_markers(units_dir, unit.name) if _same_rows(m, unit)]
    if not markers:
        return None
    first = min(markers, key=lambda m: (m["finished_at"], m["attempt"]))
    fields = {k: first[k] for k in UnitResult.__dataclass_fields__ if k in first and k != "tokenized_now"}
    return UnitResult(**fields, tokenized_now=False)


def _same_rows(marker: dict, unit: Unit) -> bool:
    return (marker.get("file_sha256"), marker.get("row_groups")) == (unit.file_sha256,
                                                                    [unit.first_row_group, unit.stop_row_group])


def tokenize_unit(unit: Unit, job: TokenizeJob) -> UnitResult:
    """Tokenizes ``unit`` unless it is done; returns its result either way."""
    for name, value in WORKER_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        return _tokenize(unit, job)
    except Exception as e:  # noqa: BLE001 - the storage's own errors (OSError; gcsfs's HttpError) become storage trouble
        if not (isinstance(e, OSError) or type(e).__name__ == "HttpError"):
            raise
        raise StorageTrouble(f"unit {unit.name}: reading {unit.file} or writing under {job.units_dir} failed "
                             f"({type(e).__name__}: {e})") from e  # fmt: skip


def _tokenize(unit: Unit, job: TokenizeJob) -> UnitResult:
    done = completed(job.units_dir, unit)
    if done is not None:
        return done
    start = time.perf_counter()
    attempt = uuid.uuid4().hex[:12]
    lengths_url, tokens_url = attempt_files(job.units_dir, unit.name, attempt)
    lengths_digest, tokens_digest = hashlib.sha256(), hashlib.sha256()
    rows = tokens = characters = 0
    with open_whole(lengths_url) as lengths_file, open_whole(tokens_url) as tokens_file:
        pending: list[np.ndarray] = []
        pending_tokens = 0
        for texts in read_texts(unit, job.text_key, job.batch_rows):
            for encoded in job.processor([{job.text_key: t} for t in texts]):
                pending.append(np.asarray(encoded["input_ids"], dtype=np.int32))
                pending_tokens += len(pending[-1])
            rows += len(texts)
            characters += sum(map(len, texts))
            if pending_tokens >= job.flush_tokens:
                tokens += _flush(pending, lengths_file, tokens_file, lengths_digest, tokens_digest)
                pending, pending_tokens = [], 0
        tokens += _flush(pending, lengths_file, tokens_file, lengths_digest, tokens_digest)
    if rows != unit.rows:
        raise SourceError(f"{unit.file}: row groups {unit.first_row_group}-{unit.stop_row_group - 1} hold {rows} "
                          f"documents, the footer says {unit.rows}")  # fmt: skip
    result = UnitResult(unit.name, attempt, rows, tokens, characters,
                        unit_digest(lengths_digest, tokens_digest), time.perf_counter() - start,
                        socket.gethostname())  # fmt: skip
    marker = {**result.to_json(), "finished_at": time.time(), "pid": os.getpid(), "file_sha256": unit.file_sha256,
              "row_groups": [unit.first_row_group, unit.stop_row_group]}  # fmt: skip
    import json

    write_whole(f"{unit_dir(job.units_dir, unit.name)}/done-{attempt}.json", json.dumps(marker, sort_keys=True))
    return result


def _flush(pending, lengths_file, tokens_file, lengths_digest, tokens_digest) -> int:
    if not pending:
        return 0
    lengths = np.fromiter((len(p) for p in pending), dtype="<i8", count=len(pending)).tobytes()
    flat = np.concatenate(pending).astype("<i4", copy=False).tobytes()
    lengths_digest.update(lengths)
    tokens_digest.update(flat)
    lengths_file.write(lengths)
    tokens_file.write(flat)
    return sum(len(p) for p in pending)


def unit_digest(lengths_digest, tokens_digest) -> str:
    """The unit's digest from the running digests of its two streams."""
    return hashlib.sha256(lengths_digest.digest() + tokens_digest.digest()).hexdigest()
