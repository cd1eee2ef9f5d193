"""Newer jax than the pinned 0.10.2, for the benchmarks only (the GPU image has jax 0.11).

24. Pinned haliax calls ``jax.core.is_constant_dim``, which jax 0.11 removed (it survives as
    ``jax._src.core.is_constant_dim``): :func:`restore_jax_names_haliax_uses`.
25. Levanter's package ``__init__`` fails to import on jax 0.11, though its model code works:
    :func:`levanter_importable` loads ``levanter.<submodule>`` without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _drop_levanter_modules() -> None:
    for name in [m for m in sys.modules if m == "levanter" or m.startswith("levanter.")]:
        del sys.modules[name]


def restore_jax_names_haliax_uses() -> None:
    """Pinned haliax (1.4.dev453) calls ``jax.core.is_constant_dim`` in ``hax.dot``, which jax removed in 0.11; the
    function still exists as ``jax._src.core.is_constant_dim``. For the benchmarks only (the GPU image has jax 0.11),
    the public name is put back when missing; with the pinned jax 0.10.2 this does nothing."""
    import jax.core

    if not hasattr(jax.core, "is_constant_dim"):
        from jax._src import core as jax_core

        jax.core.is_constant_dim = jax_core.is_constant_dim


def levanter_importable() -> str:
    """Makes ``levanter.<submodule>`` importable; returns ``"full"`` or ``"models only"`` (package init skipped)."""
    restore_jax_names_haliax_uses()
    try:
        importlib.import_module("levanter")
        return "full"
    except ImportError:
        _drop_levanter_modules()
    spec = importlib.util.find_spec("levanter")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("levanter is not installed")
    package = types.ModuleType("levanter")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["levanter"] = package
    return "models only"
