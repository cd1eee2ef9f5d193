"""A time limit for test fixtures, which pytest-timeout leaves alone once it times test functions only (conftest)."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Iterator


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Raises ``TimeoutError`` naming ``what`` in the main thread once ``seconds`` have passed (a subprocess that
    ``subprocess.run`` waits on is killed on the way out). Nests: an enclosing limit that expires first still wins."""
    outer_remaining = signal.alarm(0)
    outer_handler = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()

    def expire(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds} s")

    if outer_remaining and outer_remaining <= seconds:
        signal.signal(signal.SIGALRM, outer_handler)
        signal.alarm(outer_remaining)
    else:
        signal.signal(signal.SIGALRM, expire)
        signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_remaining:
            signal.alarm(max(1, round(outer_remaining - (time.monotonic() - started))))
