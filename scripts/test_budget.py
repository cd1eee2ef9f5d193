"""Writes tests/durations_budget.json from a test session's durations (.cache/test-durations.json, written by
tests/helpers/durations.py at the end of every pytest session): every slow test and every test over --min_seconds,
with the seconds it took. Run it after a full `make test` on an idle CI-like machine (2 cores). Given several
sessions' files (runs of one commit: this machine's speed varies by a third between them), each test's budget is its
median over the sessions that ran it, for the tests the last session ran (a test renamed or removed since an
earlier session is not budgeted).

    python scripts/test_budget.py [--durations .cache/test-durations.json ...] [--min_seconds 3] [--note TEXT]
                                  [--output tests/durations_budget.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.durations import BUDGET, DURATIONS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--durations", type=Path, nargs="+", default=[DURATIONS])
    parser.add_argument("--min_seconds", type=float, default=3.0)
    parser.add_argument("--output", type=Path, default=BUDGET)
    parser.add_argument("--note", default=None, help="where the sessions came from (commits, machine state)")
    args = parser.parse_args(argv)
    sessions = [json.loads(path.read_text()) for path in args.durations]
    slow = set().union(*(session["slow"] for session in sessions))
    medians = {test: statistics.median(s["seconds"][test] for s in sessions if test in s["seconds"])
               for test in sessions[-1]["seconds"]}
    seconds = {t: round(s, 2) for t, s in medians.items() if t in slow or s >= args.min_seconds}
    walls = [session["wall_seconds"] for session in sessions]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    record = {
        "about": "Expected seconds (setup + call + teardown) of the suite's slow tests; tests/helpers/durations.py "
                 "reports tests over 1.5x these (and 5 s more) and slow tests missing here. "
                 "Made by scripts/test_budget.py.",
        "made_from": {"commit": commit.stdout.strip(), "sessions": len(sessions), "wall_seconds": walls,
                      "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores", "note": args.note},
        "seconds": dict(sorted(seconds.items())),
    }
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.output}: {len(seconds)} tests, {sum(seconds.values()):.0f} s (sessions of "
          f"{', '.join(f'{w:.0f}' for w in walls)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
