"""Which pytest-xdist worker runs what, and in which order (``make test``: ``-n 2 --dist loadgroup``).

A file is one group (its module fixtures are made once). The files whose tests start several training processes at
once (pods, the Ray launcher) are one group together: two pods at once on 2 cores slowed each other by 1.6-2.7x (a
fresh-clone run of 0e46f26, where the two Ray/gs:// pod files ran side by side). Groups start longest first (their
seconds in tests/durations_budget.json), so that no long file starts last while the other worker idles.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers.durations import load_budget

#: Test files that run pods or a Ray cluster: one worker runs them one after another.
MULTI_PROCESS_FILES = frozenset({
    "test_infra_local_ray.py", "test_gcs.py", "test_multihost.py", "test_resume_other_device_count.py",
    "test_pod_helper.py",
})
MULTI_PROCESS_GROUP = "multi-process"


def group_of(path: Path) -> str:
    return MULTI_PROCESS_GROUP if path.name in MULTI_PROCESS_FILES else path.name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config, items):
    budget = load_budget()
    seconds: dict[str, float] = defaultdict(float)
    for item in items:
        group = group_of(item.path)
        item.add_marker(pytest.mark.xdist_group(group))
        seconds[group] += budget.get(item.nodeid, 0.0)
    # Stable: within a group, and among groups without a budget, collection order is kept (every worker sorts alike).
    items.sort(key=lambda item: -seconds[group_of(item.path)])
