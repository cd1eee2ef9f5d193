"""Where a test session's time went: a report at the end of every run, against a budget kept in the repository.

``tests/durations_budget.json`` holds the expected seconds (setup + call + teardown, on CI's 2 cores) of the suite's
slow tests. At the end of a session this plugin prints every test that took over :data:`OVER` times its budget (and
:data:`OVER_BY_AT_LEAST_S` more) and every slow test (marked ``slow``, or over :data:`UNBUDGETED_S`) that has no
budget, so a slow new test is seen the day it lands. It is a report, not a failure: times on a shared 2-core machine
are noisy. Each session's durations are written to ``.cache/test-durations.json`` (``LEVANTER_MARS_TEST_DURATIONS``
names another file: .ci/newest and .ci/marin keep theirs apart from the main suite's); ``python scripts/test_budget.py``
turns that file into a new budget.

Each test phase's worker, start and end go to the same file (``timeline``, seconds from the session's first test), and
the report says how long each worker spent in tests and when it ended: a worker idle at the end shows as an early end.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUDGET = REPO / "tests" / "durations_budget.json"
DURATIONS = REPO / os.environ.get("LEVANTER_MARS_TEST_DURATIONS", ".cache/test-durations.json")
OVER = 1.5
#: ... and by at least this much: a 0.3 s test at 0.7 s is noise on a shared machine, not news (ci14 listed 70).
OVER_BY_AT_LEAST_S = 5.0
UNBUDGETED_S = 10.0

_seconds: dict[str, float] = defaultdict(float)
_slow: set[str] = set()
_timeline: list[tuple[str, float, float, str]] = []  # (worker, start, stop, test) of each test phase
_started = time.time()


def load_budget(path: Path = BUDGET) -> dict[str, float]:
    return json.loads(path.read_text())["seconds"] if path.exists() else {}


def pytest_runtest_logreport(report):
    # Under pytest-xdist the controller collects nothing, but hears every worker's reports, markers included.
    _seconds[report.nodeid] += report.duration
    if "slow" in report.keywords:
        _slow.add(report.nodeid)
    node = getattr(report, "node", None)  # set by pytest-xdist on the controller
    worker = node.gateway.id if node is not None else "main"
    if report.start > 0:  # a subtest's report (276 in optax's suite) carries no times
        _timeline.append((worker, report.start, report.stop, report.nodeid))


def from_first_start(timeline: list[tuple[str, float, float, str]]) -> list[tuple[str, float, float, str]]:
    """``timeline`` with its times in seconds from its earliest start."""
    first = min((start for _, start, _, _ in timeline), default=0.0)
    return [(worker, start - first, stop - first, test) for worker, start, stop, test in timeline]


def busy_seconds(timeline: list[tuple[str, float, float, str]]) -> dict[str, tuple[float, float]]:
    """Per worker: (seconds in tests, seconds from the session's first test start to the worker's last test end)."""
    busy: dict[str, tuple[float, float]] = {}
    for worker, start, stop, _ in from_first_start(timeline):
        inside, end = busy.get(worker, (0.0, 0.0))
        busy[worker] = (inside + stop - start, max(end, stop))
    return dict(sorted(busy.items()))


def over_budget(seconds: dict[str, float], budget: dict[str, float]) -> list[tuple[str, float, float]]:
    return sorted(((t, s, budget[t]) for t, s in seconds.items()
                   if t in budget and s > OVER * budget[t] and s - budget[t] >= OVER_BY_AT_LEAST_S),
                  key=lambda row: row[1] - row[2], reverse=True)


def unbudgeted(seconds: dict[str, float], budget: dict[str, float], slow: set[str]) -> list[tuple[str, float]]:
    return sorted(((t, s) for t, s in seconds.items() if t not in budget and (t in slow or s > UNBUDGETED_S)),
                  key=lambda row: row[1], reverse=True)


def pytest_terminal_summary(terminalreporter):
    if not _seconds or hasattr(terminalreporter.config, "workerinput"):
        return
    budget = load_budget()
    write = terminalreporter.write_line
    terminalreporter.section("time against tests/durations_budget.json (a report, not a failure)")
    late = over_budget(_seconds, budget)
    write(f"{len(late)} tests over {OVER}x their budget and by {OVER_BY_AT_LEAST_S:.0f} s or more"
          + (":" if late else ""))
    for test, took, expected in late:
        write(f"  {took:7.1f} s (budget {expected:.1f} s)  {test}")
    missing = unbudgeted(_seconds, budget, _slow)
    write(f"{len(missing)} slow tests without a budget" + (":" if missing else ""))
    for test, took in missing:
        write(f"  {took:7.1f} s  {test}")
    busy = busy_seconds(_timeline)
    write("workers: " + ", ".join(f"{w} in tests {inside:.0f} s, done at {end:.0f} s"
                                  for w, (inside, end) in busy.items()))
    DURATIONS.parent.mkdir(exist_ok=True)
    DURATIONS.write_text(json.dumps({
        "wall_seconds": round(time.time() - _started, 1), "slow": sorted(_slow & set(_seconds)),
        "seconds": {t: round(s, 2) for t, s in sorted(_seconds.items())},
        "timeline": [[w, round(a, 2), round(b, 2), t] for w, a, b, t in from_first_start(_timeline)],
    }, indent=1))
    write(f"durations of this session: {DURATIONS}")
