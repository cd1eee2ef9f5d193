"""Training configs as YAML mappings: merging sections, as a comparison, a benchmark or a test writes a run's config."""

from __future__ import annotations

import copy
from typing import Any, Mapping


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied; nested mappings merge, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
