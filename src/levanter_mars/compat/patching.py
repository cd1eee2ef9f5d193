"""The one helper every patch in this package uses."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def patched(target: Any, **attributes: Any) -> Iterator[None]:
    """Temporarily sets attributes on a module or class, restoring them afterwards."""
    missing = object()
    saved = {name: getattr(target, name, missing) for name in attributes}
    for name, value in attributes.items():
        setattr(target, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(target, name)
            else:
                setattr(target, name, value)
