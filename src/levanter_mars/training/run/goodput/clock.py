"""Where an attempt's time goes, measured as it runs: one clock per process, started when the attempt starts.

The attempt's wall time is split into ``startup`` (setup before the first step and teardown after the last, what is
not compiling), ``compile``, ``train``, ``checkpoint`` and ``eval`` (the ``lost`` part of the record is decided
later, by the attempt that redoes steps: see :mod:`.arithmetic`). The program says which phase it is in
(:meth:`PhaseClock.phase`, :func:`timed` for hooks); everything the main thread does in a phase counts to it, except compilation: jax reports the
duration of each tracing, lowering and backend compile (or load from the compilation cache) through
``jax.monitoring``, and the clock moves those seconds from the phase they happened in to ``compile``. Compilations on
other threads (the data loader's) overlap the main thread's work and are not counted.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator, Optional

from levanter_mars.training.run.launch_id import ATTEMPT_STARTED_ENV

MEASURED = ("startup", "compile", "train", "checkpoint", "eval")
CATEGORIES = (*MEASURED, "lost")


class PhaseClock:
    def __init__(self, started: float):
        self.started = started
        """When the attempt started (seconds since the epoch): the launcher's clock, else this process's start."""
        self._seconds = dict.fromkeys(MEASURED, 0.0)
        self._seconds["startup"] = max(0.0, time.time() - started)  # before this clock existed: interpreter, imports
        self._phase = "startup"
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._events: frozenset[str] = frozenset()

    @property
    def current_phase(self) -> str:
        return self._phase

    def _switch(self, phase: str) -> str:
        assert phase in MEASURED and phase != "compile", phase
        with self._lock:
            now = time.monotonic()
            self._seconds[self._phase] += now - self._since
            previous, self._phase, self._since = self._phase, phase, now
        return previous

    def enter(self, phase: str) -> None:
        """From now on, time counts to ``phase``."""
        self._switch(phase)

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        previous = self._switch(phase)
        try:
            yield
        finally:
            self._switch(previous)

    def on_compile(self, event: str, duration: float, **_) -> None:
        """A ``jax.monitoring`` duration listener: a compilation stage on the main thread counts to ``compile``."""
        if event not in self._events or threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            self._seconds["compile"] += duration
            self._seconds[self._phase] -= duration

    def seconds(self) -> dict[str, float]:
        """Every category so far, the phase under way included."""
        with self._lock:
            snapshot = dict(self._seconds)
            snapshot[self._phase] += time.monotonic() - self._since
        return {k: round(max(v, 0.0), 3) for k, v in snapshot.items()}

    def listen_to_compilations(self) -> None:
        import jax.monitoring

        from levanter_mars.compat.jax_compilation import compile_events

        self._events = frozenset(compile_events())
        jax.monitoring.register_event_duration_secs_listener(self.on_compile)


_clock: Optional[PhaseClock] = None


def attempt_started(environ=os.environ) -> float:
    """The launcher's start of this attempt, else this process's own start."""
    if environ.get(ATTEMPT_STARTED_ENV):
        try:
            return float(environ[ATTEMPT_STARTED_ENV])
        except ValueError:
            pass
    import psutil

    return psutil.Process().create_time()


def start() -> PhaseClock:
    """This process's clock (one per process: a second call returns the first)."""
    global _clock
    if _clock is None:
        _clock = PhaseClock(attempt_started())
        _clock.listen_to_compilations()
    return _clock


def current() -> Optional[PhaseClock]:
    return _clock


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """``PhaseClock.phase`` of this process's clock; nothing if none was started (a library user's trainer)."""
    if _clock is None:
        yield
    else:
        with _clock.phase(name):
            yield


def timed(name: str, hook):
    """A trainer hook (a callable of a step's info, or a Levanter ``Callback``) whose time counts to phase ``name``."""
    from levanter.callbacks import Callback

    class Timed(Callback):
        def on_step(self, info, force: bool = False):
            with phase(name):
                return hook.on_step(info, force=force) if isinstance(hook, Callback) else hook(info)

    return Timed()
