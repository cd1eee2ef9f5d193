"""Registration of the optimizer configs with Levanter, only where a Levanter can be imported.

The optimizer needs only jax, optax, equinox and haliax; Levanter (the pinned ``levanter`` or Marin's
``marin-levanter``, which installs the same ``levanter`` package) is optional. Where one is importable,
``import levanter_mars.optim`` is enough for ``optimizer: {type: mars-adamw | mars-lion | mars-shampoo | mars-m}`` to
parse in its configs, so a Marin script needs no import of ours beyond the optimizer package.
"""

from __future__ import annotations

import importlib


def register_with_levanter() -> bool:
    """Registers ``mars-*`` with Levanter's ``OptimizerConfig`` if Levanter is importable; returns whether it did."""
    try:
        importlib.import_module("levanter.optim")
    except ImportError:
        # Not installed, or installed but not importable here (a GPU image without Ray: compat entry 25); the
        # optimizer itself does not need it.
        return False
    importlib.import_module("levanter_mars.optim.levanter_config")  # its decorators register the names
    return True
