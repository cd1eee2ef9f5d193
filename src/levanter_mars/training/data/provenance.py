"""What a token cache was built from: its provenance record, and how a record differs from a config.

Levanter reuses any finished cache in ``cache_dir`` whatever the sources named now, so a changed URL, dataset id,
tokenizer or source file would silently train on the old tokens. Each split's cache therefore carries
``provenance.json``: the sources (URLs, or the HF dataset id/name/split), each source file's size and version
(local mtime, or object generation/etag) with a content checksum, the tokenizer (name and a hash of its vocabulary)
and the preprocessing that changes tokens (format, EOS/BOS appending). ``cache_check`` compares it on every run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import braceexpand
import draccus
import fsspec
from levanter.data.text import LmDatasetFormatBase, preprocessor_for_format

from levanter_mars.training.data.sources import expand_local, is_local
from levanter_mars.training.whole_files import write_whole

logger = logging.getLogger(__name__)

RECORD_FILE = "provenance.json"
RECORD_VERSION = 1
#: Object metadata that changes whenever an object is rewritten (gcsfs: generation; s3fs: ETag; hf: blob_id).
_VERSION_KEYS = ("generation", "etag", "ETag", "blob_id", "mtime", "updated", "LastModified")
#: Checksums of the content itself, which let a rewritten but identical object still match.
_CHECKSUM_KEYS = ("md5Hash", "crc32c", "ContentMD5")


@dataclass(frozen=True)
class Difference:
    """One way a cache's record differs from the config: ``field`` is the config field (or file) to look at."""

    field: str
    old: Any
    new: Any
    #: A recorded source file that is gone: alone, only a warning (raw files may be deleted once tokenized).
    missing_file: bool = False

    def describe(self) -> str:
        return f"{self.field}: {_short(self.old)} -> {_short(self.new)}"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."


def _sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _local_stat(path: str, *, with_checksum: bool) -> dict:
    stat = os.stat(path)
    entry = {"size": stat.st_size, "version": f"mtime_ns:{stat.st_mtime_ns}"}
    if with_checksum:
        entry["checksum"] = _sha256_of_file(path)
    return entry


def _remote_stat(info: dict) -> dict:
    version = next((f"{key}:{info[key]}" for key in _VERSION_KEYS if info.get(key) is not None), None)
    checksum = next((f"{key}:{info[key]}" for key in _CHECKSUM_KEYS if info.get(key) is not None), None)
    return {"size": info.get("size"), "version": version, "checksum": checksum}


def source_files(urls, *, with_checksum: bool = True) -> dict[str, dict]:
    """Size, version and checksum of every file the URLs expand to (braces and globs), keyed by path or URL."""
    files: dict[str, dict] = {}
    for url in urls:
        if is_local(url):
            for path in expand_local(url):
                files[path] = _local_stat(path, with_checksum=with_checksum)
            continue
        fs, _ = fsspec.core.url_to_fs(url)
        for pattern in braceexpand.braceexpand(url):
            paths = fs.glob(pattern) if any(c in pattern for c in "*?[") else [pattern]
            for path in paths:
                if fs.exists(path):
                    files[fs.unstrip_protocol(path)] = _remote_stat(fs.info(path))
    return files


def tokenizer_record(name: str, tokenizer) -> dict:
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab_hash = None
    if get_vocab is not None:  # Levanter's passthrough tokenizer has no vocabulary: its size is all there is
        vocab = sorted(get_vocab().items(), key=lambda item: (item[1], item[0]))
        vocab_hash = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return {"name": name, "vocab_size": len(tokenizer), "vocab_sha256": vocab_hash}


def preprocessing_record(component_format, tokenizer, enforce_eos: bool) -> dict:
    """The settings that change the tokens: the format and what Levanter's processor appends (BOS/EOS)."""
    processor = preprocessor_for_format(component_format, tokenizer, enforce_bos=True, enforce_eos=enforce_eos)
    metadata = {k: v for k, v in processor.metadata.items() if k not in ("tokenizer", "vocab_size")}
    fmt = {"type": LmDatasetFormatBase.get_choice_name(type(component_format)), **draccus.encode(component_format)}
    return {"format": fmt, "enforce_eos": enforce_eos, **metadata}


def record_for(data, component, split: str, *, with_checksum: bool = True) -> dict:
    """The provenance record of ``split`` of ``component``, one source of ``data`` (itself, or one of its configs)."""
    tokenizer = data.the_tokenizer
    record: dict[str, Any] = {"version": RECORD_VERSION, "split": split}
    if hasattr(component, "train_urls"):
        urls = list(getattr(component, f"{split}_urls", None) or [])
        record["source"] = {"urls": urls}
        record["files"] = source_files(urls, with_checksum=with_checksum)
    else:
        record["source"] = {"id": component.id, "name": component.name, "split": split}
    record["tokenizer"] = tokenizer_record(data.tokenizer, tokenizer)
    record["preprocessing"] = preprocessing_record(component.format, tokenizer, data.enforce_eos)
    return record


def _file_differences(field: str, old_files: dict, new_files: dict) -> list[Difference]:
    differences = []
    for path, old in old_files.items():
        new = new_files.get(path)
        if new is None:
            differences.append(Difference(f"{field} file {path}", "present", "missing", missing_file=True))
        elif old.get("size") != new.get("size"):
            differences.append(Difference(f"{field} file {path}: size", old.get("size"), new.get("size")))
        elif old.get("version") != new.get("version"):
            # Rewritten with the same size: the content decides where it was recorded (a copy or `touch` is not a
            # change); without a checksum, the new version alone does.
            if old.get("checksum") is None:
                differences.append(Difference(f"{field} file {path}: version", old.get("version"), new.get("version")))
            elif old["checksum"] != _checksum(path, new):
                differences.append(Difference(f"{field} file {path}: content", old["checksum"], new.get("checksum")))
    for path in new_files.keys() - old_files.keys():
        differences.append(Difference(f"{field} file {path}", "absent", "present"))
    return differences


def _checksum(path: str, entry: dict) -> Optional[str]:
    if entry.get("checksum") is None and is_local(path) and os.path.exists(path):
        entry["checksum"] = _sha256_of_file(path)
    return entry.get("checksum")


def differences(field: str, split: str, old: dict, new: dict) -> list[Difference]:
    """How the recorded ``old`` differs from ``new`` (made by :func:`record_for` for this config), config fields
    first. A changed tokenizer name alone is not a difference: the same vocabulary in another directory is the same
    tokenizer."""
    found = []
    old_source, new_source = old.get("source", {}), new.get("source", {})
    if "urls" in old_source or "urls" in new_source:
        if old_source.get("urls") != new_source.get("urls"):
            found.append(Difference(f"{field}.{split}_urls", old_source.get("urls"), new_source.get("urls")))
    for key in ("id", "name"):
        if old_source.get(key) != new_source.get(key):
            found.append(Difference(f"{field}.{key}", old_source.get(key), new_source.get(key)))
    old_tok, new_tok = old.get("tokenizer", {}), new.get("tokenizer", {})
    if any(old_tok.get(k) != new_tok.get(k) for k in ("vocab_sha256", "vocab_size")):
        found.append(Difference("data.tokenizer", _describe_tokenizer(old_tok), _describe_tokenizer(new_tok)))
    old_pre, new_pre = old.get("preprocessing", {}), new.get("preprocessing", {})
    for key in sorted(old_pre.keys() | new_pre.keys()):
        if old_pre.get(key) != new_pre.get(key):
            named = {"format": f"{field}.format", "enforce_eos": "data.enforce_eos"}
            where = named.get(key, f"data.tokenizer ({key})")  # the rest (BOS/EOS appended) follows the tokenizer
            found.append(Difference(where, old_pre.get(key), new_pre.get(key)))
    if found and "urls" in old_source and old_source.get("urls") != new_source.get("urls"):
        return found  # other files entirely: listing each one adds nothing
    return found + _file_differences(f"{field}.{split}_urls", old.get("files", {}), new.get("files", {}))


def _describe_tokenizer(record: dict) -> str:
    digest = (record.get("vocab_sha256") or "none")[:12]
    return f"{record.get('name')} ({record.get('vocab_size')} tokens, vocabulary sha256 {digest})"


def read_record(split_dir: str) -> Optional[dict]:
    """The cache's record; None if it has none, or one that is not a record (then it cannot be checked either)."""
    path = os.path.join(split_dir, RECORD_FILE)
    fs, fs_path = fsspec.core.url_to_fs(path)
    if not fs.exists(fs_path):
        return None
    try:
        with fs.open(fs_path, "r") as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        logger.warning("%s is not a provenance record (%s): treating the cache as unrecorded", path, e)
        return None
    return record if isinstance(record, dict) and "source" in record else None


def write_record(split_dir: str, record: dict) -> None:
    # Whole or absent: a kill never leaves half a record.
    write_whole(os.path.join(split_dir, RECORD_FILE), json.dumps(record, indent=2, sort_keys=True))
