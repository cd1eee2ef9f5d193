"""Random choices in tests (which step to kill at, which host): seeded, and the seed printed.

The seed is fixed per name, so CI makes the same choices every run; ``LEVANTER_MARS_TEST_SEED=<n>`` explores others,
and the printed line (pytest shows it with a failure) says how to replay one.
"""

from __future__ import annotations

import os
import random
import zlib

SEED_VARIABLE = "LEVANTER_MARS_TEST_SEED"


def seeded_random(name: str) -> random.Random:
    chosen = os.environ.get(SEED_VARIABLE)
    seed = int(chosen) if chosen else zlib.crc32(name.encode())
    print(f"random choices of {name}: seed {seed} (replay with {SEED_VARIABLE}={seed})")
    return random.Random(seed)
