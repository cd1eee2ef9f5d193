"""Copying a dataset's files from where they are published (the hub) into the cache's own storage, once, each copy
verified, so that no tokenizing worker ever streams from the hub (its rate limits and outages stop a build that
reads it from thousands of tasks).

The mirror keeps the repository's layout under ``mirror_dir`` (``sample/100BT/000_00000.parquet``) and a manifest,
``mirror.json``: the source (id, revision) and each file's size, SHA-256 and source version. A file enters the
manifest only once its copy is whole and verified: its size, and its SHA-256 against the one the hub publishes (the
LFS pointer), or, where the source publishes none (a local folder, a bucket), the copy hashed again as stored. A rerun
copies only what the manifest lacks or what changed at the source (its published SHA-256, else its size or version:
a bucket's generation, a file's mtime); a copy cut off by a kill is never in it (``whole_files.open_whole``), and the
temporary files a killed copy leaves on local disk are removed when the mirror starts (it has one writer). A stop
(Ctrl-C, SIGTERM) ends the copies in flight at their next block and records those that finished.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import fsspec
from fsspec.implementations.local import LocalFileSystem

from levanter_mars.pretokenize.dataset_repo import DatasetRepo, RepoFile
from levanter_mars.pretokenize.errors import StorageTrouble
from levanter_mars.training.whole_files import open_whole, read_json, write_whole

logger = logging.getLogger(__name__)

MANIFEST = "mirror.json"
BLOCK = 8 << 20
ATTEMPTS = 3
BACKOFF_S = 2.0


@dataclass(frozen=True)
class MirroredFile:
    """A verified copy: where it is, and the size and SHA-256 it was verified to have."""

    path: str
    url: str
    size: int
    sha256: str


def join(base: str, path: str) -> str:
    return f"{base.rstrip('/')}/{path}"


def read_manifest(mirror_dir: str) -> dict:
    try:
        return read_json(join(mirror_dir, MANIFEST)) or {"source": None, "files": {}}
    except ValueError as e:  # written whole, so only storage damage makes it unreadable
        raise StorageTrouble(f"{e}: remove it to copy every file again") from None


def mirror(repo: DatasetRepo, files: Sequence[RepoFile], mirror_dir: str, *, threads: int = 4,
           report: Callable[[str], None] = logger.info) -> list[MirroredFile]:  # fmt: skip
    """Copies every file the manifest lacks (``threads`` at a time), verifies each, and returns all of them in
    ``files``' order."""
    manifest = read_manifest(mirror_dir)
    source = {"id": repo.dataset_id, "revision": repo.revision}
    recorded = manifest.get("files", {})
    if manifest.get("source") not in (None, source):
        logger.warning("%s: mirrored from %s, now %s: files whose size or checksum differ are copied again",
                       join(mirror_dir, MANIFEST), manifest["source"], source)  # fmt: skip
    manifest["source"] = source
    todo = [f for f in files if not _still_valid(recorded.get(f.path), f, join(mirror_dir, f.path))]
    if todo:
        total = sum(f.size for f in todo)
        report(f"mirror: copying {len(todo)} of {len(files)} file(s), {total / 1e9:.2f} GB, to {mirror_dir}")
        _remove_temporaries(mirror_dir)
    stop = threading.Event()

    def record(file: RepoFile, sha256: str) -> None:
        recorded[file.path] = {"size": file.size, "sha256": sha256, "source": repo.url(file.path),
                               "source_version": file.version}  # fmt: skip
        manifest["files"] = recorded
        write_whole(join(mirror_dir, MANIFEST), _json(manifest))

    pool = ThreadPoolExecutor(max_workers=max(1, threads))
    futures = {pool.submit(_copy_verified, repo, f, join(mirror_dir, f.path), stop): f for f in todo}
    try:
        for done, future in enumerate(as_completed(futures), 1):
            file = futures[future]
            record(file, future.result())
            report(f"mirror: {done}/{len(todo)} {file.path} ({file.size / 1e6:.1f} MB, "
                   f"sha256 {recorded[file.path]['sha256'][:12]})")  # fmt: skip
    except BaseException:
        stop.set()  # the copies in flight end at their next block; those that finished are kept
        pool.shutdown(wait=True, cancel_futures=True)
        for future, file in futures.items():
            if file.path not in recorded and future.done() and not future.cancelled() and future.exception() is None:
                record(file, future.result())
        raise
    pool.shutdown()
    return [MirroredFile(f.path, join(mirror_dir, f.path), f.size, recorded[f.path]["sha256"]) for f in files]


def _remove_temporaries(mirror_dir: str) -> None:
    """What copies killed before their rename left (``.<name>.<id>.tmp``, local disk only)."""
    fs, root = fsspec.core.url_to_fs(mirror_dir)
    if isinstance(fs, LocalFileSystem) and os.path.isdir(root):
        for directory, _, names in os.walk(root):
            for name in names:
                if name.startswith(".") and name.endswith(".tmp"):
                    os.remove(os.path.join(directory, name))


def _still_valid(entry: Optional[dict], file: RepoFile, url: str) -> bool:
    """A recorded copy stands for the source file if the source is the same (size, published checksum) and the copy
    is still there at its size."""
    if entry is None or entry.get("size") != file.size:
        return False
    if file.sha256 is not None and entry.get("sha256") != file.sha256:
        return False
    if file.sha256 is None and file.version is not None and entry.get("source_version") != file.version:
        return False  # rewritten at the source (same size or not): nothing published to tell, so copy it again
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return int(fs.info(path)["size"]) == file.size
    except FileNotFoundError:
        return False


def _copy_verified(repo: DatasetRepo, file: RepoFile, url: str, stop: threading.Event) -> str:
    last: Exception | None = None
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _copy_once(repo, file, url, stop)
        except (OSError, StorageTrouble) as e:
            if isinstance(e, (PermissionError, IsADirectoryError, NotADirectoryError)):
                raise
            last = e
            logger.warning("mirror: %s, attempt %d of %d: %s", file.path, attempt, ATTEMPTS, e)
            if attempt < ATTEMPTS and not stop.wait(BACKOFF_S * 2 ** (attempt - 1)):  # a rate limit eases off
                continue
            if stop.is_set():
                raise Stopped(file.path) from None
    raise StorageTrouble(f"mirror: {repo.url(file.path)} could not be copied to {url} in {ATTEMPTS} attempts: {last}")


class Stopped(Exception):
    """A copy ended by the mirror's stop (its file is not copied)."""


def _copy_once(repo: DatasetRepo, file: RepoFile, url: str, stop: threading.Event) -> str:
    digest = hashlib.sha256()
    size = 0
    with repo.open(file.path, "rb", block_size=BLOCK) as source, open_whole(url) as sink:
        while block := source.read(BLOCK):
            if stop.is_set():
                raise Stopped(file.path)
            digest.update(block)
            size += len(block)
            sink.write(block)
        if size != file.size:
            raise StorageTrouble(f"{repo.url(file.path)}: read {size} bytes, the source lists {file.size}")
        read = digest.hexdigest()
        if file.sha256 is not None and read != file.sha256:
            raise StorageTrouble(f"{repo.url(file.path)}: SHA-256 {read} read, {file.sha256} published")
    if file.sha256 is None:  # nothing published to check against: the copy as stored must hash as it was read
        stored = sha256_of(url)
        if stored != read:
            raise StorageTrouble(f"{url}: stored copy hashes to {stored}, its source read as {read}")
    return read


def sha256_of(url: str) -> str:
    digest = hashlib.sha256()
    with fsspec.open(url, "rb", block_size=BLOCK) as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _json(value) -> str:
    import json

    return json.dumps(value, indent=1, sort_keys=True) + "\n"
