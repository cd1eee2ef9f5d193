"""The goodput record (training/run/goodput/): an attempt's phases as its clock measures them, compilations moved to
``compile`` from jax's own events, a dead attempt completed by the next one from what it left, redone steps counted as
lost, write-then-rename, the summary lines and the timeline. End to end (a killed pod through the launcher, on local
disk; a killed run with its cache on gs://): tests/test_infra_local_ray.py, tests/test_gcs.py."""

import datetime
import json
import os
import threading

import jax
import jax.numpy as jnp
import pytest

from levanter_mars.compat.jax_compilation import compile_events
from levanter_mars.training.run import goodput
from levanter_mars.training.run.goodput import arithmetic, record
from levanter_mars.training.run.goodput import clock as goodput_clock
from levanter_mars.training.run.goodput.report import describe, plot_goodput


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


T0 = 1_800_000_000.0


class FixedClock:
    """A clock whose measurements the test sets, at a time the test sets (``now``); the rest of the time since the
    start is ``startup``, so that they add up to the wall time as a real clock's do."""

    def __init__(self, now: list, started: float, **seconds):
        self.now, self.started = now, started
        self.values = {k: 0.0 for k in goodput_clock.MEASURED} | seconds

    def seconds(self):
        measured = {k: v for k, v in self.values.items() if k != "startup"}
        return {**measured, "startup": self.now[0] - self.started - sum(measured.values())}


@pytest.fixture
def now(monkeypatch):
    """The record's time, set by the test."""
    current = [T0]
    monkeypatch.setattr(record, "_now", lambda: current[0])
    return current


class FakeTime:
    """The ``time`` module as goodput_clock sees it: a wall clock and a monotonic one that move only when the test
    says, so the clock's arithmetic is checked exactly and no assertion depends on how fast this machine is."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch):
    fake = FakeTime(T0)
    monkeypatch.setattr(goodput_clock, "time", fake)
    return fake


def test_phases_add_up_to_the_wall_time_and_compilations_count_once(fake_time):
    """A compilation stage's duration (as jax reports it) moves from the phase it happened in to compile. One on
    another thread (the data loader's) overlaps the main thread's work and is not counted, nor is an event of another
    kind. Durations are multiples of 1/4 s: exact in floating point."""
    clock = goodput_clock.PhaseClock(T0 - 2.0)  # the attempt started 2 s before the clock: interpreter, imports
    clock.listen_to_compilations()
    event = compile_events()[-1]
    fake_time.advance(1.0)
    clock.enter("train")
    fake_time.advance(5.0)
    clock.on_compile(event, 1.5)
    other = threading.Thread(target=clock.on_compile, args=(event, 4.0))
    other.start()
    other.join()
    clock.on_compile("/jax/some/other/duration", 8.0)
    with clock.phase("eval"):
        fake_time.advance(0.75)
    fake_time.advance(2.25)
    seconds = clock.seconds()
    assert seconds == {"startup": 3.0, "compile": 1.5, "train": 5.75, "checkpoint": 0.0, "eval": 0.75}
    assert sum(seconds.values()) == fake_time.now - clock.started, "the phases add up to the attempt's wall time"
    assert clock.current_phase == "train"


def test_jax_reports_a_main_thread_compilation_to_the_clock_and_not_another_threads(fake_time):
    clock = goodput_clock.PhaseClock(T0)
    clock.listen_to_compilations()
    clock.enter("train")
    x = jnp.arange(512.0)
    jax.jit(lambda v: jnp.sin(v) @ jnp.cos(v) + 1.7)(x).block_until_ready()  # a program no other test compiles
    compiled_here = clock.seconds()["compile"]
    assert compiled_here > 0
    other = threading.Thread(target=lambda: jax.jit(lambda v: jnp.tanh(v) * 3.1)(x).block_until_ready())
    other.start()
    other.join()
    assert clock.seconds()["compile"] == compiled_here, "another thread's compile is not counted"


def _attempt_one(run_dir, now) -> goodput.GoodputRecord:
    """A first attempt of launch L, started at T0, that trained steps 0..14 (the checkpoint of step 10 written) and
    took its last snapshot at T0 + 50; then it was killed (nothing closes it)."""
    clock = FixedClock(now, T0, compile=20.0, train=3.0)
    now[0] = T0 + 25
    record = goodput.GoodputRecord.open(run_dir, clock, "L")
    record.begin(0)
    now[0], clock.values["train"] = T0 + 40, 6.0
    record.checkpoint_saving(11)  # the checkpoint step-10 holds 11 updates: a resume there starts at step 11
    now[0] = T0 + 50
    clock.values.update(train=8.0, checkpoint=1.0)
    record.step_done(14)
    record.write()
    return record


def test_a_dead_attempt_is_completed_by_the_next_and_its_redone_steps_are_lost(tmp_path, now):
    run_dir = tmp_path / "run"
    first = _attempt_one(run_dir, now)
    # Process 0 wrote metrics.jsonl up to step 16 after that snapshot, until T0 + 54; then the host was killed.
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in range(17)))
    os.utime(metrics, (T0 + 54, T0 + 54))

    second_clock = FixedClock(now, T0 + 60, compile=3.0, train=9.0)  # the launcher restarted the slice at T0 + 60
    second = goodput.GoodputRecord.open(run_dir, second_clock, "L")
    second.begin(11)  # resumed from the step-10 checkpoint: steps 11..16 of the first attempt are redone
    now[0] = T0 + 80
    second.close(0, "done")
    data = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)
    a, b = data["attempts"]
    assert (a["launch_id"], a["attempt"], b["attempt"]) == ("L", 1, 2)
    assert a["exit_code"] is None and "completed by attempt 2" in a["reason"] and a["ended_as"] == "lost"
    assert a["steps_redone_next"] == 6  # steps 11..16
    assert a["last_step"] == 16 and a["ended"] == _iso(T0 + 54)
    assert a["seconds"]["train"] == pytest.approx(6.0)  # kept: the training before the checkpoint it resumed from
    assert a["seconds"]["lost"] == pytest.approx(2.0 + 4.0)  # redone (8 - 6), and the 4 s after its last record
    assert sum(a["seconds"].values()) == pytest.approx(54.0), "an attempt's seconds add up to its wall time"
    assert a["lost_detail"] == {"redone": 2.0, "unrecorded": 4.0, "between_attempts": 0.0}
    # The 6 s between the first attempt's last sign of life and the restart are the launch's, lost before attempt 2.
    assert (b["first_step"], b["exit_code"], b["seconds"]["lost"]) == (11, 0, 6.0)
    assert b["lost_detail"] == {"redone": 0.0, "unrecorded": 0.0, "between_attempts": 6.0}
    assert sum(b["seconds"].values()) == pytest.approx(20.0 + 6.0)
    # One launch: its wall runs from the first start to the last end, the restart in between included, and its
    # attempts' seconds, lost ones included, add up to it.
    assert data["wall_seconds"] == pytest.approx(80.0)
    assert sum(sum(x["seconds"].values()) for x in (a, b)) == pytest.approx(data["wall_seconds"])
    assert data["productive_seconds"] == pytest.approx(6.0 + 9.0)
    assert data["goodput"] == pytest.approx(15.0 / 80.0, abs=1e-4)
    assert first.path == second.path and not list(run_dir.glob("*.tmp")), "written whole, then renamed"


def test_settling_is_idempotent_and_a_resume_before_an_attempt_loses_all_of_its_training():
    attempts = [
        {"started": _iso(0), "ended": _iso(50), "first_step": 5, "last_step": 9, "checkpoint_marks": {},
         "seconds": {"startup": 1, "compile": 1, "train": 40, "checkpoint": 0, "eval": 0, "lost": 0}},
        {"started": _iso(60), "ended": _iso(90), "first_step": 3, "last_step": 9, "checkpoint_marks": {"6": 10.0},
         "seconds": {"startup": 1, "compile": 1, "train": 28, "checkpoint": 0, "eval": 0, "lost": 0}},
        {"started": _iso(100), "ended": None, "updated": _iso(110), "first_step": 6, "last_step": 7,
         "seconds": {"startup": 1, "compile": 1, "train": 8, "checkpoint": 0, "eval": 0, "lost": 0}},
    ]  # fmt: skip
    for _ in range(3):
        arithmetic.settle(attempts)
    assert [a["seconds"]["train"] for a in attempts] == [0.0, 10.0, 8.0]
    assert [a["seconds"]["lost"] for a in attempts] == [40.0, 18.0, 0.0]
    totals = arithmetic.totals(attempts)  # three plain commands: three launches, the gaps between them not counted
    assert totals["wall_seconds"] == pytest.approx(50 + 30 + 10)
    assert totals["productive_seconds"] == pytest.approx(18.0)


def test_the_summary_and_the_timeline_show_every_attempt(tmp_path, now):
    run_dir = tmp_path / "run"
    _attempt_one(run_dir, now)
    now[0] = T0 + 70
    record = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0 + 60, train=4.0), "L")
    record.begin(11)
    record.eval_failed(20, "pydocs_mc", "ValueError: scoring failed")
    record.close(0, "done")
    data = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)
    lines = describe(data)
    assert lines[0].startswith(f"  goodput:     {data['goodput']}") and "2 attempt(s)" in lines[0]
    assert "1. launch L, its attempt 1: steps 0..14, no exit recorded" in lines[1]
    assert lines[2].strip().startswith("lost: redone ")  # what attempt 2 redid of attempt 1's training
    assert "2. launch L, its attempt 2: steps 11..None, exit 0" in lines[3]
    assert lines[4].strip().startswith("lost: between attempts ")
    assert lines[5] == "  eval failed at step 20 (attempt 2): pydocs_mc: ValueError: scoring failed"
    png = plot_goodput(data, tmp_path / "goodput.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000


def test_a_rerun_of_a_complete_run_is_no_attempt_but_a_start_up_failure_is(tmp_path, now):
    """Issue 46 (5): a plain rerun of a finished command trains nothing and ends done; on 2cf0d97 it added an attempt
    and lowered the goodput (0.9 -> 0.75 with no training). A rerun that fails before training is an attempt."""
    run_dir = tmp_path / "run"
    now[0] = T0 + 10
    done = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0, train=9.0), None)
    done.begin(0)
    done.close(0, "done")
    before = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)
    assert before["goodput"] == pytest.approx(0.9)

    now[0] = T0 + 100
    rerun = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0 + 95), None)
    rerun.close(0, "done")  # the trainer found the run complete: no begin()
    assert goodput.read_record(run_dir / goodput.GOODPUT_FILENAME) == before

    now[0] = T0 + 200
    failed = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0 + 195), None)
    failed.close(2, "ConfigError: data.train_urls[0]: no such file")
    after = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)
    assert [a["exit_code"] for a in after["attempts"]] == [0, 2]
    assert after["wall_seconds"] == pytest.approx(10.0 + 5.0)


def test_a_rerun_of_a_complete_run_still_completes_the_attempt_that_died_after_its_last_step(tmp_path, now):
    """The last attempt trained every step, then died before recording its end: the rerun (complete, no attempt of
    its own) completes it from metrics.jsonl."""
    run_dir = tmp_path / "run"
    _attempt_one(run_dir, now)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in range(20)))
    os.utime(metrics, (T0 + 56, T0 + 56))
    now[0] = T0 + 90
    rerun = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0 + 85), None)
    rerun.close(0, "done")
    (only,) = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)["attempts"]
    assert only["last_step"] == 19 and only["ended"] == _iso(T0 + 56) and "completed by attempt" in only["reason"]


def test_a_dead_attempt_is_not_credited_with_steps_an_earlier_attempt_logged():
    """metrics.jsonl newer than the dead attempt's last record, but its last step is before the attempt began (the
    log of an earlier attempt, rewritten on resume): the attempt ended at its last record."""
    entry = arithmetic.new_entry([], "L", T0)
    entry.update(first_step=30, last_step=34, updated=_iso(T0 + 20))
    arithmetic.complete_dead_attempt(entry, (T0 + 25, 29), completed_by=2)
    assert (entry["ended"], entry["last_step"], entry["unrecorded"]) == (_iso(T0 + 20), 34, 0.0)
    arithmetic.complete_dead_attempt(entry, (T0 + 25, 36), completed_by=2)
    assert (entry["ended"], entry["last_step"], entry["unrecorded"]) == (_iso(T0 + 25), 36, 5.0)


@pytest.mark.parametrize("saved,resumed_at,redone", [(17, 18, 0), (None, 11, 7)])
def test_a_preempted_attempt_says_what_it_saved_and_the_next_how_many_steps_it_redid(tmp_path, now, saved,
                                                                                     resumed_at, redone):
    """Saved on the notice: the next attempt starts right after it, 0 redone; past the grace (None saved): from the
    checkpoint before, redoing the steps since."""
    run_dir = tmp_path / "run"
    first = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0, train=10.0), "L")
    first.begin(0)
    for step in range(18):
        first.step_done(step)
    first.preempted(saved, 0.4)
    now[0] = T0 + 20
    first.close(9, "Preempted: ...")
    second = goodput.GoodputRecord.open(run_dir, FixedClock(now, T0 + 25, train=4.0), "L")
    second.begin(resumed_at)
    now[0] = T0 + 40
    second.close(0, "done")
    a, b = goodput.read_record(run_dir / goodput.GOODPUT_FILENAME)["attempts"]
    ended = "preempted, not saved" if saved is None else f"preempted, saved at step {saved}"
    assert a["ended_as"] == ended and a["preemption"] == {"saved_step": saved, "save_seconds": 0.4}
    assert a["steps_redone_next"] == redone and b["steps_redone_next"] is None and b["ended_as"] == "done"
    line = describe(goodput.read_record(run_dir / goodput.GOODPUT_FILENAME))[1]
    assert f"exit 9 ({ended} in 0.4 s; the next attempt redid {redone} step(s))" in line, line
