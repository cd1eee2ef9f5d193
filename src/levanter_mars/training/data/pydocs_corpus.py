"""The embedded corpora: Python's own documentation, and that of every installed distribution, available offline.

Two sources (``embedded_corpus_sources``):

* ``stdlib`` (the default): the standard library's docstrings (module, class and function docstrings of every
  ``.py`` file, read with ``ast`` so no module is imported and nothing runs) and the reference-manual topics in
  ``pydoc_data.topics``: about 2M characters, ~0.6M tokens (PSF licence).
* ``installed``: the same, then every distribution installed beside this package (for the lock: ~400 of them, from
  jax to transformers), each its description (its README) and the docstrings of its ``.py`` files, with every
  docstring already in the corpus left out (libraries copy docstrings between modules; a pretraining corpus must not
  repeat text). About 45M characters, ~13M tokens: enough for optimizer comparisons that never repeat data. Which
  distributions, at which versions, is part of the corpus's fingerprint and listed in ``corpus.json``.

A stable hash of each document's name sends about 5% of documents to a held-out validation split.

The tokenizer is a 4,096-token byte-level BPE trained on the training split. The real GPT-2 vocabulary (50,257
tokens) makes the LM head dominate a nano model: about 1.4 s/step on 2 CPU cores against 0.15 s/step with the
small vocabulary, so the small BPE is what lets the default run finish in a few minutes. Byte-level BPE with
GPT-2's pre-tokenizer keeps the model and data path identical to a real GPT-2 run.

Everything is written under one directory, is deterministic, and is rebuilt only if missing or stale.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import sysconfig
from pathlib import Path
from typing import Iterator, Optional, Sequence

from levanter_mars.training.whole_files import write_whole

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
VOCAB_SIZE = 4096
SOURCES = ("stdlib", "installed")
VALIDATION_PERCENT = 5
EOS_TOKEN = "<|endoftext|>"
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
#: Directories of an installed distribution that hold tests or vendored copies of other distributions' code.
SKIPPED_PACKAGE_DIRS = {"test", "tests", "testing", "_vendor", "vendor", "__pycache__"}


def _docstrings_of(source: str) -> list[str]:
    tree = ast.parse(source)
    parts = []
    module_doc = ast.get_docstring(tree)
    if module_doc:
        parts.append(module_doc)
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                parts.append(f"{kind} {node.name}:\n{doc}")
    return parts


def iter_documents(sources: str = "stdlib", site_dirs: Optional[Sequence[str]] = None) -> Iterator[tuple[str, str]]:
    """(name, text) pairs, in a fixed order. ``site_dirs``: where the installed distributions are (default: this
    interpreter's site-packages)."""
    seen = _FirstOccurrences()
    for name, parts in _stdlib_documents():
        seen.keep(parts)  # the stdlib corpus itself is left as it was before other sources existed
        yield name, "\n\n".join(parts)
    if sources == "installed":
        for name, parts in _installed_documents(site_dirs if site_dirs is not None else _site_dirs()):
            parts = seen.keep(parts)
            if parts:
                yield name, "\n\n".join(parts)


class _FirstOccurrences:
    """Which texts the corpus holds already, by digest."""

    def __init__(self):
        self._digests: set[str] = set()

    def keep(self, parts: Sequence[str]) -> list[str]:
        """The parts not seen before, now seen."""
        kept = []
        for part in parts:
            digest = hashlib.sha256(part.encode()).hexdigest()
            if digest not in self._digests:
                self._digests.add(digest)
                kept.append(part)
        return kept


def _stdlib_documents() -> Iterator[tuple[str, list[str]]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in SKIPPED_DIRS for part in rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            parts = _docstrings_of(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if parts:
            yield f"stdlib/{rel.as_posix()}", parts

    from pydoc_data.topics import topics

    for topic in sorted(topics):
        text = topics[topic].strip()
        if text:
            yield f"topics/{topic}", [text]


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def installed_distributions(site_dirs: Sequence[str]) -> list[importlib.metadata.Distribution]:
    """Every distribution installed in ``site_dirs``, once each (the first found), ordered by normalized name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions(path=list(site_dirs)):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normalized(name), dist)
    return [found[name] for name in sorted(found)]


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_documents(site_dirs: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    for dist in installed_distributions(site_dirs):
        name = _normalized(dist.metadata["Name"])
        description = (dist.metadata.get_payload() or dist.metadata.get("Description") or "").strip()
        if len(description) > 40:
            yield f"{name}/DESCRIPTION", [description]
        for file in sorted(dist.files or [], key=str):
            rel = Path(str(file))
            if rel.suffix != ".py" or rel.name.startswith("test_") or ".." in rel.parts:
                continue
            if any(part in SKIPPED_PACKAGE_DIRS for part in rel.parts[:-1]):
                continue
            try:
                parts = _docstrings_of(Path(dist.locate_file(file)).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            if parts:
                yield f"{name}/{rel.as_posix()}", parts


def _split_of(name: str) -> str:
    bucket = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 100
    return "validation" if bucket < VALIDATION_PERCENT else "train"


def _fingerprint(sources: str = "stdlib", distributions: Sequence[str] = ()) -> dict:
    fingerprint = {
        "format": FORMAT_VERSION,
        "python": sys.version.split()[0],
        "vocab_size": VOCAB_SIZE,
        "validation_percent": VALIDATION_PERCENT,
    }
    if sources != "stdlib":  # the stdlib corpus's fingerprint is the one corpora built before sources existed have
        fingerprint["sources"] = sources
        fingerprint["distributions_sha256"] = hashlib.sha256("\n".join(distributions).encode()).hexdigest()
    return fingerprint


def _distribution_pins(sources: str, site_dirs: Optional[Sequence[str]]) -> list[str]:
    if sources != "installed":
        return []
    dists = installed_distributions(site_dirs if site_dirs is not None else _site_dirs())
    return [f"{_normalized(d.metadata['Name'])}=={d.version}" for d in dists]


def _write_jsonl(path: Path, texts: list[str]) -> str:
    payload = "".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts).encode()
    write_whole(path, payload)
    return hashlib.sha256(payload).hexdigest()


def train_tokenizer(texts: list[str], output_dir: Path, vocab_size: int = VOCAB_SIZE) -> None:
    """A GPT-2-style byte-level BPE with ``<|endoftext|>`` as bos/eos, saved as a HF tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=1 << 30,
    )
    wrapped.save_pretrained(str(output_dir))


def check_sources(sources: str, field: str = "embedded_corpus_sources") -> None:
    if sources not in SOURCES:
        raise ValueError(f"{field} must be one of {SOURCES}, got {sources!r}")


def prepare(directory: str | os.PathLike, sources: str = "stdlib", site_dirs: Optional[Sequence[str]] = None) -> dict:
    """Builds ``train.jsonl``, ``validation.jsonl`` and ``tokenizer/`` under ``directory`` if they are missing or
    were made from other sources, by another Python or format version. Returns the corpus manifest."""
    check_sources(sources)
    directory = Path(directory)
    manifest_path = directory / "corpus.json"
    pins = _distribution_pins(sources, site_dirs)
    fingerprint = _fingerprint(sources, pins)
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        files_present = all((directory / name).exists() for name in ("train.jsonl", "validation.jsonl", "tokenizer"))
        if files_present and manifest.get("fingerprint") == fingerprint:
            return manifest

    logger.info("Building the embedded Python-docs corpus (%s) in %s", sources, directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[str]] = {"train": [], "validation": []}
    for name, text in iter_documents(sources, site_dirs):
        splits[_split_of(name)].append(text)

    hashes = {split: _write_jsonl(directory / f"{split}.jsonl", texts) for split, texts in splits.items()}
    train_tokenizer(splits["train"], directory / "tokenizer")
    manifest = {
        "fingerprint": fingerprint,
        "sources": sources,
        "documents": {split: len(texts) for split, texts in splits.items()},
        "characters": {split: sum(map(len, texts)) for split, texts in splits.items()},
        "tokens": _token_counts(directory / "tokenizer", splits),
        "sha256": hashes,
    }
    if pins:
        manifest["distributions"] = pins
    write_whole(manifest_path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")  # last: the corpus is complete
    return manifest


def _token_counts(tokenizer_dir: Path, splits: dict[str, list[str]]) -> dict[str, int]:
    """Tokens of each split as training sees them: each document's tokens plus its end-of-text token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return {split: sum(len(e.ids) + 1 for e in tokenizer.encode_batch(texts)) for split, texts in splits.items()}


def config_section(directory: str | os.PathLike, sources: str = "stdlib") -> dict:
    """The training-config entries that point a run at the corpus in ``directory`` (built there on first use):
    ``embedded_corpus`` and the ``data`` paths, to merge into a config."""
    directory = Path(directory)
    section = {"embedded_corpus_sources": sources} if sources != "stdlib" else {}
    return {
        **section,
        "embedded_corpus": str(directory),
        "data": {
            "train_urls": [str(directory / "train.jsonl")],
            "validation_urls": [str(directory / "validation.jsonl")],
            "cache_dir": str(directory / "tokenized"),
            "tokenizer": str(directory / "tokenizer"),
        },
    }
