"""Why the data step stops, and its exit code: the training program's table (``training/errors.py``) where they
mean the same, so a script reads one table.

| code | meaning |
| --- | --- |
| 0 | the cache is built and verified (or was already) |
| 1 | crash: a bug, or a worker that kept dying (Ray's retries spent) |
| 2 | bad input: the config, a source file (no ``text``, empty, corrupt or truncated, an unknown config name) or a cache path no retry can write; the message names the field or file, and nothing half-written is counted as done |
| 5 | storage trouble: the hub or the bucket failing, a copy that does not match its source's checksum in 3 attempts, a cache that failed its check (cut back: rerun), the build's lease not renewed for half its TTL |
| 8 | the build is live elsewhere: another data step holds the source's build lease (`<source's cache>/build.lease.json`), or took it over |
| 130 | interrupted (Ctrl-C, SIGTERM): rerun the same command to finish |
"""

from __future__ import annotations

from levanter_mars.training.config import ConfigError
from levanter_mars.training.errors import ExitCode


class SourceError(ConfigError):
    """A source file the build cannot read as documents: the message names the file (and the column)."""


class CachePathError(ConfigError):
    """A cache or mirror path no retry can write (a file in the way, no permission, read-only)."""


class StorageTrouble(RuntimeError):
    """Storage that failed and may work on a retry: the hub, the bucket, a copy whose checksum did not match."""


INTERRUPTED = 130


def exit_code(error: BaseException) -> int:
    from levanter_mars.training.errors import RunLeasedError, StorageError

    if isinstance(error, ConfigError):
        return int(ExitCode.CONFIG_ERROR)
    if isinstance(error, (StorageTrouble, StorageError)):
        return int(ExitCode.CHECKPOINT_STORAGE)
    if isinstance(error, RunLeasedError):
        return int(ExitCode.LIVE_ELSEWHERE)
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    return int(ExitCode.CRASH)
