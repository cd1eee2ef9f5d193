"""Levanter's own MARS (defect 8), which the benchmarks compare against."""

from __future__ import annotations

import contextlib
import unittest.mock
from typing import Iterator

import jax


@contextlib.contextmanager
def jax_tree_map_restored() -> Iterator[None]:
    """Defect 8: Levanter's ``mars`` calls ``jax.tree_map``, which jax removed. Only while it is built and traced,
    ``jax.tree_map`` is ``jax.tree.map``."""
    with unittest.mock.patch.object(jax, "tree_map", jax.tree.map, create=True):
        yield
