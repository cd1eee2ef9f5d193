"""Goodput: where a run's time went, attempt by attempt, kept by process 0 in ``<log_dir>/<run id>/goodput.json``.

```
{"attempts": [{"launch_id", "attempt", "started", "ended", "exit_code", "reason", "first_step", "last_step",
               "seconds": {"startup", "compile", "train", "checkpoint", "eval", "lost"},
               "lost_detail": {"redone", "unrecorded", "between_attempts"}, "compile_cache", ...}],
 "wall_seconds", "productive_seconds", "goodput"}
```

- :mod:`.clock` measures an attempt as it runs (one clock per process); its seconds add up to the attempt's wall time
  (``ended - started``).
- :mod:`.arithmetic` (pure) decides what was lost, itemised in each attempt's ``lost_detail``: the training of steps
  redone after a restart (the steps after the checkpoint the next attempt resumed from), for an attempt that died
  without recording its end the time after its last record (its steps after that were redone too), and the time its
  launch spent between the attempt before it and its start (``between_attempts``), so that a launch's attempts'
  seconds add up to its wall time. ``train`` is the training time kept; ``productive_seconds``
  sums it, and ``goodput = productive_seconds / wall_seconds``. ``wall_seconds`` spans each launch from its first
  attempt's start to its last attempt's end (the launcher's restarts included); separate launches (a plain rerun of
  the command) add up, the time between them does not count. A rerun of a complete run is no attempt.
- :mod:`.record` reads and writes the file (whole: temporary name, then rename). An attempt killed with any host,
  process 0 included, leaves its last snapshot; the next attempt completes it from that snapshot and from
  ``metrics.jsonl`` (its last step, and its time: process 0 writes it every step), and decides what was lost from the
  step it resumes at.
- :mod:`.report` tells it in words (the run summary) and as a timeline (``goodput.png``).

The compile-cache counts come from jax's own logging (:mod:`levanter_mars.compat.jax_compilation`, defect 37), and an
attempt's start from the launcher (:data:`levanter_mars.training.run.launch_id.ATTEMPT_STARTED_ENV`).
"""

from levanter_mars.training.run.goodput.clock import CATEGORIES, MEASURED, PhaseClock, phase, start, timed
from levanter_mars.training.run.goodput.record import GOODPUT_FILENAME, GoodputRecord, read_record

__all__ = ["CATEGORIES", "MEASURED", "PhaseClock", "phase", "start", "timed", "GOODPUT_FILENAME", "GoodputRecord",
           "read_record"]  # fmt: skip
