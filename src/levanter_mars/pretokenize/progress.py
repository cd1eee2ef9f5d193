"""The progress line of a build: units done, tokens per second (in all and per worker), and the time left, at most
every ``every_s`` seconds (a line when something changed, or every minute regardless).

Two rates: over the wall time of the tokenizing (its workers' start, scheduling and waits included), and over the
units' own seconds (a worker's time inside its units: the rate one core sustains once running)."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from levanter_mars.pretokenize.units import Unit
from levanter_mars.pretokenize.worker import UnitResult


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    def __init__(self, label: str, units: Sequence[Unit], done_before: Iterable[str], workers: int, every_s: float,
                 report: Callable[[str], None], clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.label = label
        self.units = {u.name: u for u in units}
        self.total_bytes = sum(u.bytes for u in units)
        done_before = set(done_before)
        self.done = len(done_before)
        self.bytes_left = self.total_bytes - sum(self.units[n].bytes for n in done_before)
        self.workers = workers
        self.every_s = every_s
        self.report = report
        self.clock = clock
        self.started = clock()
        self.last_line_at = self.started
        self.last_done = self.done
        self.stopped: float | None = None
        self.tokens_now = 0
        self.bytes_now = 0
        self.units_now = 0
        self.unit_seconds = 0.0

    def unit_done(self, result: UnitResult) -> None:
        self.done += 1
        self.bytes_left -= self.units[result.unit].bytes
        if result.tokenized_now:
            self.units_now += 1
            self.tokens_now += result.tokens
            self.bytes_now += self.units[result.unit].bytes
            self.unit_seconds += result.seconds

    def stop(self) -> None:
        """The tokenizing is over: rates are over the time until now."""
        self.stopped = self.clock()

    def rates(self) -> dict:
        elapsed = max((self.stopped or self.clock()) - self.started, 1e-9)
        per_second = self.tokens_now / elapsed
        return {"tokens_per_second": per_second, "tokens_per_second_per_worker": per_second / self.workers,
                "workers": self.workers, "seconds": elapsed, "tokens": self.tokens_now, "units": self.units_now,
                "unit_tokens_per_second": self.tokens_now / self.unit_seconds if self.unit_seconds else None}

    def line(self) -> str:
        rates = self.rates()
        left = len(self.units) - self.done
        parts = [f"{self.label}: {self.done}/{len(self.units)} units"]
        if self.units_now:
            parts.append(f"{rates['tokens_per_second'] / 1e6:.2f}M tokens/s ({self.workers} worker(s), "
                         f"{rates['tokens_per_second_per_worker'] / 1e6:.2f}M/s each)")  # fmt: skip
            bytes_per_second = self.bytes_now / rates["seconds"]
            if left and bytes_per_second > 0:
                parts.append(f"ETA {duration(self.bytes_left / bytes_per_second)}")
        elif left:
            parts.append(f"started {duration(self.clock() - self.started)} ago, first unit not done yet")
        return ", ".join(parts)

    def tick(self) -> None:
        now = self.clock()
        changed = self.done != self.last_done
        if now - self.last_line_at >= (self.every_s if changed else max(60.0, self.every_s)):
            self.report(self.line())
            self.last_line_at, self.last_done = now, self.done
