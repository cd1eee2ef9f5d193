"""The data a config names, checked before anything is built or compiled (part of ``training.validation``): every
local data file exists and holds a document, and the tokenizer loads."""

from __future__ import annotations

import os

from levanter_mars.training.config import ConfigError
from levanter_mars.training.data.sources import empty_data_paths, missing_data_paths


def check_data(
    data, *, offline: bool = False, built_by_the_run: str | None = None, elsewhere: bool = False
) -> list[str]:
    """Data files and tokenizer. ``built_by_the_run``: a directory the run builds before it reads anything (the
    embedded corpus, not yet built where the launcher checks). Returns the checks skipped because they need the network
    (``offline``: a hub tokenizer, a token cache in a bucket). ``elsewhere``: the run loads its tokenizer on other
    machines (the launcher's hosts), so a hub tokenizer this machine may not fetch (``HF_HUB_OFFLINE=1``) is
    skipped."""
    skipped: list[str] = []
    pending = os.path.abspath(built_by_the_run).rstrip("/") + "/" if built_by_the_run else None

    def yet_to_be_built(message: str) -> bool:
        return pending is not None and pending in message

    problems = [m for m in missing_data_paths(data, offline=offline, skipped=skipped) if not yet_to_be_built(m)]
    problems = problems or [m for m in empty_data_paths(data) if not yet_to_be_built(m)]
    if problems:
        raise ConfigError("; ".join(problems))
    tokenizer = getattr(data, "tokenizer", None)
    if not tokenizer or tokenizer == "passthrough":
        return skipped
    looks_local = tokenizer.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(tokenizer))
    if pending is not None and os.path.abspath(os.path.expanduser(tokenizer)).startswith(pending):
        return skipped
    if looks_local and not os.path.isdir(os.path.expanduser(tokenizer)):
        raise ConfigError(f"data.tokenizer: no such tokenizer directory {tokenizer!r}")
    hub_offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    if offline and not looks_local and not hub_offline:
        return skipped + [f"data.tokenizer {tokenizer!r} (from the Hugging Face Hub)"]
    try:
        data.the_tokenizer  # noqa: B018 - loads (and caches) it
    except Exception as e:  # noqa: BLE001
        if not looks_local and (offline or (elsewhere and hub_offline)):  # not in this machine's cache: may be there
            return skipped + [f"data.tokenizer {tokenizer!r} (not in this machine's Hugging Face cache)"]
        hint = " (HF_HUB_OFFLINE=1: only local or cached tokenizers load)" if hub_offline else ""
        raise ConfigError(f"data.tokenizer: cannot load {tokenizer!r}{hint}: {type(e).__name__}: {e}") from e
    return skipped
