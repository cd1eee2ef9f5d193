"""Every monkeypatch and private-name use of a dependency (Levanter, lm-eval, datasets, wandb, jax, Ray, argparse,
draccus).

:data:`DEFECTS` is the index: one row per upstream defect, with the pinned version it was seen in, what goes wrong,
what works around it, and the test that reproduces it against the installed packages, so that the day upstream fixes
one, its test fails and the workaround can be deleted (tests/compat/, one file per compat module;
tests/compat/test_defect_index.py checks every row). The rows live in levanter_defects.py (the pinned Levanter's)
and other_defects.py. Numbers are never reused: a fixed defect's row goes, and so does its number. Nothing outside this package patches a dependency or reaches for a private name.
"""

from __future__ import annotations

from levanter_mars.compat import levanter_defects, other_defects
from levanter_mars.compat.defect import Defect

__all__ = ["DEFECTS", "Defect"]

DEFECTS: tuple[Defect, ...] = tuple(
    sorted(levanter_defects.DEFECTS + other_defects.DEFECTS, key=lambda defect: defect.number)
)
