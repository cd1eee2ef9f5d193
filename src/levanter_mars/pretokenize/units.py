"""The units of work of a build: consecutive row groups of one parquet file, about ``unit_bytes`` each, in the
document order the cache keeps (files sorted as the dataset lists them, rows in file order: the order ``datasets``
streams the same config in, so the cache equals the one Levanter builds from it).

Planning reads only each file's footer, and refuses, before any tokenizing, what cannot be read as documents: a file
that is not parquet (corrupt or truncated: the footer is at the end), one without the text column or with it not a
string, an empty one.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from levanter_mars.pretokenize.errors import SourceError
from levanter_mars.pretokenize.mirror import MirroredFile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unit:
    """Row groups ``[first_row_group, stop_row_group)`` of one file: ``rows`` documents (the footer's count)."""

    name: str
    file: str
    """The mirrored copy's URL."""
    file_sha256: str
    first_row_group: int
    stop_row_group: int
    rows: int
    bytes: int
    """Uncompressed bytes of its row groups, every column (the work it holds: the progress line counts in them)."""

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(raw: dict) -> "Unit":
        return Unit(**raw)


def open_parquet(url: str) -> pq.ParquetFile:
    """The file's footer; a file that is not readable parquet is a :class:`SourceError` naming it."""
    try:
        handle = fsspec.open(url, "rb").open()
        return pq.ParquetFile(handle)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, pa.ArrowException, OSError, ValueError) as e:
        raise SourceError(f"{url}: not a readable parquet file, corrupt or truncated ({e})") from None


def check_text_column(parquet: pq.ParquetFile, url: str, text_key: str, field: str) -> None:
    schema = parquet.schema_arrow
    if text_key not in schema.names:
        raise SourceError(f"{url}: no column {text_key!r} ({field}.format.text_key); its columns: "
                          f"{', '.join(schema.names)}")  # fmt: skip
    kind = schema.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise SourceError(f"{url}: column {text_key!r} holds {kind}, not text")


def plan_file(index: int, file: MirroredFile, text_key: str, unit_bytes: int, field: str) -> list[Unit]:
    parquet = open_parquet(file.url)
    check_text_column(parquet, file.url, text_key, field)
    metadata = parquet.metadata
    if metadata.num_rows == 0:
        raise SourceError(f"{file.url}: empty (0 documents); a source file holds at least one")
    units: list[Unit] = []
    start, rows, size = 0, 0, 0
    for group in range(metadata.num_row_groups):
        rows += metadata.row_group(group).num_rows
        size += metadata.row_group(group).total_byte_size
        if size >= unit_bytes or group == metadata.num_row_groups - 1:
            if rows:
                units.append(Unit(f"{index:05d}-{start:05d}", file.url, file.sha256, start, group + 1, rows, size))
            start, rows, size = group + 1, 0, 0
    return units


def plan_units(files: Sequence[MirroredFile], *, text_key: str, unit_bytes: int, field: str,
               threads: int = 8) -> list[Unit]:  # fmt: skip
    """Every file's units, in order (footers read ``threads`` at a time)."""
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        per_file = list(pool.map(lambda item: plan_file(item[0], item[1], text_key, unit_bytes, field),
                                 enumerate(files)))  # fmt: skip
    return [unit for units in per_file for unit in units]


def read_texts(unit: Unit, text_key: str, batch_rows: int) -> Iterator[list[str]]:
    """The unit's documents, ``batch_rows`` at a time; a missing text (null) is a :class:`SourceError` naming the
    file and row."""
    parquet = open_parquet(unit.file)
    row = sum(parquet.metadata.row_group(g).num_rows for g in range(unit.first_row_group))
    try:
        batches = parquet.iter_batches(batch_size=batch_rows, row_groups=range(unit.first_row_group,
                                       unit.stop_row_group), columns=[text_key])  # fmt: skip
        for batch in batches:
            texts = batch.column(0).to_pylist()
            if any(t is None for t in texts):
                missing = row + next(i for i, t in enumerate(texts) if t is None)
                raise SourceError(f"{unit.file}: row {missing} has no {text_key!r} (null)")
            row += len(texts)
            yield texts
    except (pa.ArrowInvalid, pa.ArrowException) as e:
        raise SourceError(f"{unit.file}: row groups {unit.first_row_group}-{unit.stop_row_group - 1} are not "
                          f"readable, corrupt ({e})") from None  # fmt: skip
