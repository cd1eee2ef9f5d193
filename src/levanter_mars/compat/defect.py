"""One row of the compat index (:data:`levanter_mars.compat.DEFECTS`): an upstream defect and what answers it."""

from __future__ import annotations

from typing import NamedTuple

LEVANTER = "levanter==1.2.dev1644"
#: Where most reproducing tests live: tests/compat/test_<module>*.py, named after the workaround's compat module.
COMPAT_TESTS = "tests/compat/"


class Defect(NamedTuple):
    number: int
    upstream: str
    """``package==version`` as pinned (``python==3.11`` for the standard library)."""
    symptom: str
    workaround: str
    """A dotted name under ``levanter_mars`` (``module.attribute``), or a file of the repository."""
    test: str
    """The pytest node id (``path::function``) that reproduces the defect."""
