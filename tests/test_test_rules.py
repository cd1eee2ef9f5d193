"""Rules every test keeps, checked over the test sources: random choices are seeded (tests/helpers/seeds.py) and no
test polls or sleeps for less than POLL_S (a faster loop steals CPU from the runs it watches and bets on a window)."""

import re
from pathlib import Path

from tests.helpers.training import POLL_S

TESTS = Path(__file__).resolve().parent
SOURCES = sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)
SHORT_WAIT = re.compile(r"\b(?:poll(?:\s*:\s*float)?\s*=|sleep\()\s*(\d+(?:\.\d+)?|\.\d+)\s*[,)]")
UNSEEDED = re.compile(r"(?<!jax\.)\brandom\.(?:random|randint|randrange|choice|choices|sample|shuffle|uniform)\(|\brandom\.Random\(\)")


def _hits(pattern):
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                yield f"{path.relative_to(TESTS.parent)}:{number}: {match.group(0)}", match


def test_no_test_waits_less_than_the_poll_interval():
    short = [where for where, match in _hits(SHORT_WAIT) if float(match.group(1)) < POLL_S]
    assert not short, short


def test_every_random_choice_is_seeded():
    unseeded = [where for where, _ in _hits(UNSEEDED)]
    assert not unseeded, unseeded
