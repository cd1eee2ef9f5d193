"""Writes tests/durations_budget.json from a test session's durations (.cache/test-durations.json, written by
tests/helpers/durations.py at the end of every pytest session): every slow test and every test over --min_seconds,
with the seconds it took. Run it after a full `make test` on an idle CI-like machine (2 cores).

    python scripts/test_budget.py [--durations .cache/test-durations.json] [--min_seconds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.durations import BUDGET, DURATIONS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--durations", type=Path, default=DURATIONS)
    parser.add_argument("--min_seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    session = json.loads(args.durations.read_text())
    slow = set(session["slow"])
    seconds = {t: s for t, s in session["seconds"].items() if t in slow or s >= args.min_seconds}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    record = {
        "about": "Expected seconds (setup + call + teardown) of the suite's slow tests; tests/helpers/durations.py "
                 "reports tests over 1.5x these and slow tests missing here. Made by scripts/test_budget.py.",
        "made_from": {"commit": commit.stdout.strip(), "wall_seconds": session["wall_seconds"],
                      "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores"},
        "seconds": dict(sorted(seconds.items())),
    }
    BUDGET.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{BUDGET.relative_to(REPO)}: {len(seconds)} tests, {sum(seconds.values()):.0f} s of "
          f"{session['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
