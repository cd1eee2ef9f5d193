"""A dataset as the hub publishes it: a folder of files whose ``README.md`` names the configs, read through fsspec.

One code path for every place a dataset can be: the hub (``HuggingFaceFW/fineweb-edu`` is
``hf://datasets/HuggingFaceFW/fineweb-edu@<revision>``, read with huggingface_hub's ``HfFileSystem``), a bucket
(``gs://...``) or a local folder (the offline stand-in). A config's files are its card's ``data_files`` patterns for the
split, globbed in the repository and sorted (the order ``datasets`` streams them in). Each file comes with its size
and, where the storage publishes one, its SHA-256 (the hub's LFS pointer) so that a copy can be verified.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any, Optional

import fsspec
import yaml

from levanter_mars.training.config import ConfigError

CARD = "README.md"


@dataclass(frozen=True)
class RepoFile:
    """One data file: its path inside the repository, size in bytes, published SHA-256 (None: not published) and
    the version its storage gives it (a bucket's generation, a file's mtime, the hub's blob id)."""

    path: str
    size: int
    sha256: Optional[str]
    version: Optional[str] = None


def is_hub_id(dataset_id: str) -> bool:
    """``org/name`` on the hub, as opposed to a URL or a path on this machine."""
    return "://" not in dataset_id and not os.path.isabs(dataset_id) and not dataset_id.startswith(".") \
        and not os.path.exists(dataset_id) and dataset_id.count("/") == 1  # fmt: skip


class DatasetRepo:
    """The files of a dataset repository, wherever it is. ``field`` names the config field it came from, for
    errors."""

    def __init__(self, dataset_id: str, *, field: str, revision: Optional[str] = None):
        self.dataset_id = dataset_id
        self.field = field
        self.revision = revision
        if is_hub_id(dataset_id):
            from huggingface_hub import HfFileSystem

            self.fs = HfFileSystem()
            self.root = f"datasets/{dataset_id}" + (f"@{revision}" if revision else "")
        else:
            self.fs, self.root = fsspec.core.url_to_fs(dataset_id)
        self.root = self.root.rstrip("/")

    @property
    def on_hub(self) -> bool:
        return is_hub_id(self.dataset_id)

    def url(self, path: str) -> str:
        """The fsspec URL of a file of the repository (``hf://datasets/...``, ``gs://...`` or a local path)."""
        return self.fs.unstrip_protocol(f"{self.root}/{path}")

    def resolved_revision(self) -> Optional[str]:
        """The hub's commit of the repository now (None off the hub): reads pinned to it stay one snapshot."""
        if not self.on_hub:
            return None
        from huggingface_hub import HfApi

        return HfApi().dataset_info(self.dataset_id, revision=self.revision).sha

    def configs(self) -> dict[str, Any]:
        """``config_name -> data_files`` from the card's YAML header."""
        path = f"{self.root}/{CARD}"
        try:
            with self.fs.open(path, "r") as f:
                text = f.read()
        except FileNotFoundError:
            raise ConfigError(f"{self.field}.id: {self.dataset_id!r} has no {CARD} (looked for {self.url(CARD)}); "
                              "a dataset folder names its configs in its card's YAML header") from None  # fmt: skip
        header = _front_matter(text)
        configs = header.get("configs") if isinstance(header, dict) else None
        if not isinstance(configs, list) or not configs:
            raise ConfigError(f"{self.field}.id: {self.url(CARD)} names no configs (a 'configs:' list in its YAML "
                              "header)")  # fmt: skip
        self._raw_configs = {str(c.get("config_name", "default")): c for c in configs if isinstance(c, dict)}
        return {name: c.get("data_files") for name, c in self._raw_configs.items()}

    def files(self, name: Optional[str], split: str) -> list[RepoFile]:
        """The files of config ``name`` (None: the card's ``default: true`` config, else ``default``) for ``split``,
        in the order ``datasets`` streams them (each pattern resolved by its own ``resolve_pattern``, in the card's
        order, hidden files left out); [] if the config has no such split. An unknown config is a ConfigError naming
        the field and the configs there are."""
        from datasets.data_files import resolve_pattern

        configs = self.configs()
        config_name = name or next((n for n, c in self._raw_configs.items() if c.get("default")), "default")
        if config_name not in configs:
            known = ", ".join(sorted(configs))
            raise ConfigError(f"{self.field}.name: {self.dataset_id!r} has no config {config_name!r} (its configs: "
                              f"{known})")  # fmt: skip
        base = self.url("").rstrip("/")
        found: dict[str, RepoFile] = {}
        for pattern in _patterns_for_split(configs[config_name], split):
            try:
                paths = resolve_pattern(pattern, base_path=base)
            except FileNotFoundError:
                raise ConfigError(f"{self.field}: config {config_name!r} names {pattern!r} for split {split!r}, and "
                                  f"no file of {self.dataset_id!r} matches it") from None  # fmt: skip
            infos = self.fs.glob(f"{self.root}/{pattern}", detail=True)
            by_url = {self.fs.unstrip_protocol(p): info for p, info in infos.items()}
            for url in paths:
                relative = _relative(url, base)
                if relative in found:
                    continue
                info = by_url.get(url) or by_url.get(self.url(relative)) or self.fs.info(f"{self.root}/{relative}")
                found[relative] = RepoFile(relative, int(info["size"]), published_sha256(info), version_of(info))
        return list(found.values())

    def open(self, path: str, mode: str = "rb", **kwargs):
        return self.fs.open(f"{self.root}/{path}", mode, **kwargs)


def published_sha256(info: dict) -> Optional[str]:
    """The SHA-256 a storage publishes for a file: the hub's LFS pointer (``info['lfs']['sha256']``). GCS publishes
    MD5/CRC32C only, and a local folder nothing: those are hashed as they are read."""
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return str(lfs["sha256"])
    return None


#: Object metadata that changes whenever an object is rewritten (a bucket's generation, the hub's blob id, mtime).
_VERSION_KEYS = ("generation", "etag", "ETag", "blob_id", "mtime", "updated", "LastModified")


def version_of(info: dict) -> Optional[str]:
    return next((f"{key}:{info[key]}" for key in _VERSION_KEYS if info.get(key) is not None), None)


def _relative(url: str, base: str) -> str:
    """A resolved file's path inside the repository (a local path, or a URL with or without the revision)."""
    plain = [b.replace("file://", "") for b in (url, base)]
    url, base = plain
    if url.startswith(base + "/"):
        return url[len(base) + 1 :]
    return posixpath.relpath(_strip_revision(url.split("://", 1)[-1]), _strip_revision(base.split("://", 1)[-1]))


def _front_matter(text: str) -> Any:
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    try:
        return yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None


def _patterns_for_split(data_files: Any, split: str) -> list[str]:
    """The card's ``data_files`` forms: a pattern or list of patterns (all ``train``), or ``[{split, path}]``."""
    if isinstance(data_files, str):
        return [data_files] if split == "train" else []
    if isinstance(data_files, list) and all(isinstance(d, str) for d in data_files):
        return list(data_files) if split == "train" else []
    if isinstance(data_files, dict):
        data_files = [{"split": k, "path": v} for k, v in data_files.items()]
    out: list[str] = []
    for entry in data_files or []:
        if isinstance(entry, dict) and entry.get("split") == split:
            path = entry.get("path")
            out += [path] if isinstance(path, str) else list(path or [])
    return out


def _strip_revision(path: str) -> str:
    """``datasets/org/name@rev/x`` -> ``datasets/org/name/x`` (HfFileSystem answers paths without the revision)."""
    parts = path.split("/")
    return "/".join(p.split("@", 1)[0] if i == 2 else p for i, p in enumerate(parts)) if path.startswith("datasets/") \
        else path  # fmt: skip
