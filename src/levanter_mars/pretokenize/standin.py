"""An offline stand-in for FineWeb-Edu on the hub: a folder with its layout, its dataset card and its columns, made
from local text, that the first mile reads through the very code path it reads the hub with (``data.configs.X.id``
set to the folder).

FineWeb-Edu (``HuggingFaceFW/fineweb-edu``) keeps each sample under ``sample/<N>BT/*.parquet`` and names its configs
in the YAML header of its ``README.md`` (``config_name: sample-100BT``, ``data_files: [{split: train, path:
sample/100BT/*}]``); each row has ``text, id, dump, url, file_path, language, language_score, token_count, score,
int_score``. The stand-in writes the same: each config's files hold consecutive documents of the source text, in row
groups of ``row_group_rows`` rows, so a file splits into several units of work as a real 2 GB shard does.

    python -m levanter_mars.pretokenize.standin --out DIR --text .cache/pydocs-installed/train.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

#: FineWeb-Edu's columns and their Arrow types, in its order.
SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
    ("file_path", pa.string()), ("language", pa.string()), ("language_score", pa.float64()),
    ("token_count", pa.int64()), ("score", pa.float64()), ("int_score", pa.int64()),
])  # fmt: skip
DUMP = "CC-MAIN-2024-10"


@dataclass(frozen=True)
class StandinConfig:
    """One config of the stand-in: its name on the card, its folder and how many files it has."""

    name: str
    folder: str
    files: int


#: The samples FineWeb-Edu publishes, at the stand-in's size: every config reads the same text, cut into files.
DEFAULT_CONFIGS = (StandinConfig("sample-10BT", "sample/10BT", 2), StandinConfig("sample-100BT", "sample/100BT", 8))


def documents(text_path: str, limit: int | None = None) -> list[str]:
    """The ``text`` of each line of a JSONL file (the embedded corpus's ``train.jsonl``), non-empty ones only."""
    out = []
    with open(text_path) as f:
        for line in f:
            text = json.loads(line).get("text", "")
            if text.strip():
                out.append(text)
            if limit is not None and len(out) >= limit:
                break
    return out


def _rows(texts: Sequence[str], file_index: int, start: int) -> dict[str, list]:
    ids, urls, paths, scores = [], [], [], []
    for i, text in enumerate(texts):
        digest = hashlib.sha256(f"{file_index}:{start + i}:{text[:64]}".encode()).hexdigest()
        ids.append(f"<urn:uuid:{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}>")
        urls.append(f"https://example.org/{digest[:12]}")
        paths.append(f"s3://commoncrawl/crawl-data/{DUMP}/segments/{digest[:10]}/warc/{digest[10:20]}.warc.gz")
        scores.append(2.5 + (int(digest[32:36], 16) % 2000) / 1000)
    return {
        "text": list(texts), "id": ids, "dump": [DUMP] * len(texts), "url": urls, "file_path": paths,
        "language": ["en"] * len(texts), "language_score": [0.9] * len(texts),
        "token_count": [max(1, len(t) // 4) for t in texts], "score": scores,
        "int_score": [int(round(s)) for s in scores],
    }  # fmt: skip


def _split(texts: Sequence[str], parts: int) -> Iterator[Sequence[str]]:
    size, extra = divmod(len(texts), parts)
    start = 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        yield texts[start:stop]
        start = stop


def card(configs: Sequence[StandinConfig]) -> str:
    """A README.md whose YAML header names the configs as FineWeb-Edu's does."""
    header = {
        "license": "odc-by",
        "configs": [{"config_name": c.name, "data_files": [{"split": "train", "path": f"{c.folder}/*"}]}
                    for c in configs],  # fmt: skip
    }
    return (f"---\n{yaml.safe_dump(header, sort_keys=False)}---\n\n# FineWeb-Edu stand-in\n\nLocal text in "
            "FineWeb-Edu's layout and columns, for testing the first mile offline "
            "(`python -m levanter_mars.pretokenize.standin`).\n")  # fmt: skip


def write_standin(out: str, texts: Sequence[str], configs: Sequence[StandinConfig] = DEFAULT_CONFIGS,
                  row_group_rows: int = 256) -> dict:  # fmt: skip
    """Writes the folder; returns its shape: per config, files, documents and characters."""
    if not texts:
        raise ValueError("no documents to write")
    os.makedirs(out, exist_ok=True)
    shape = {}
    for config in configs:
        folder = os.path.join(out, config.folder)
        os.makedirs(folder, exist_ok=True)
        for index, part in enumerate(_split(texts, config.files)):
            table = pa.Table.from_pydict(_rows(part, index, 0), schema=SCHEMA)
            pq.write_table(table, os.path.join(folder, f"{index:03d}_00000.parquet"), row_group_size=row_group_rows)
        shape[config.name] = {"files": config.files, "documents": len(texts), "characters": sum(map(len, texts))}
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(card(configs))
    return shape


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--text", required=True, help="a JSONL file of documents ({'text': ...} per line)")
    parser.add_argument("--documents", type=int, default=None, help="at most this many documents")
    parser.add_argument("--files", type=int, default=8, help="files of sample-100BT (sample-10BT has a quarter)")
    parser.add_argument("--row_group_rows", type=int, default=256)
    parser.add_argument("--tokenizer_out", default=None,
                        help="also train a byte-level BPE of --vocab_size tokens on the text (GPT-2's size) here")
    parser.add_argument("--vocab_size", type=int, default=50257)
    args = parser.parse_args(argv)
    if not os.path.exists(args.text):
        print(f"error: --text: no such file {args.text!r}", file=sys.stderr)
        return 2
    configs = (StandinConfig("sample-10BT", "sample/10BT", max(1, args.files // 4)),
               StandinConfig("sample-100BT", "sample/100BT", args.files))  # fmt: skip
    texts = documents(args.text, args.documents)
    shape = write_standin(args.out, texts, configs, args.row_group_rows)
    if args.tokenizer_out:
        from pathlib import Path

        from levanter_mars.training.data.pydocs_corpus import train_tokenizer

        train_tokenizer(texts, Path(args.tokenizer_out), vocab_size=args.vocab_size)
        shape["tokenizer"] = {"directory": args.tokenizer_out, "vocab_size": args.vocab_size}
    print(json.dumps(shape, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
