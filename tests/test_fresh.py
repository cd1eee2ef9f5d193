"""``fresh=true`` is crash-safe (training/run/fresh.py): a set-aside a preemption cuts short is finished, into the same
destination, by whoever comes next; nothing empty and nothing of another run is moved. (Once per launch, and moving
the log too: tests/test_pod_workflow.py.)"""

from pathlib import Path

import fsspec
import pytest
from levanter.checkpoint import discover_latest_checkpoint

from levanter_mars.program_config import parse_train_config
from levanter_mars.training.run import fresh
from levanter_mars.training.run.identity import checkpoint_dir
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV
from tests.helpers.training import tiny_config

BUCKET = "memory://fresh-test"


def _config(tmp_path: Path, run_id: str = "run", fresh_start: bool = True, **checkpointer):
    overrides = {"fresh": fresh_start, **({"trainer": {"checkpointer": checkpointer}} if checkpointer else {})}
    path = tiny_config(tmp_path, tmp_path / "corpus", run_id, overrides)  # parsed only: no corpus needed
    return parse_train_config(["--config_path", str(path)])


@pytest.fixture
def memory_fs():
    fs = fsspec.filesystem("memory")
    yield fs
    if fs.exists("/fresh-test"):
        fs.rm("/fresh-test", recursive=True)


class Preempted(BaseException):
    """What a preemption does to a set-aside: it stops, anywhere."""


def _preempt_after(monkeypatch, fs, copies: int) -> None:
    done = []
    copy = type(fs).copy

    def copy_then_die(self, *args, **kwargs):
        if len(done) == copies:
            raise Preempted
        done.append(args)
        return copy(self, *args, **kwargs)

    monkeypatch.setattr(type(fs), "copy", copy_then_die)


def test_a_set_aside_preempted_mid_move_is_finished_into_the_same_destination(tmp_path, memory_fs, monkeypatch):
    """On object storage a move is a copy and a delete per object. Preempted after 7 of 20 objects: the retry of the
    same launch moves the other 13 into the same .old directory (on 4cb100e: a second one, the old run split in two,
    neither loadable) and then resumes what it starts."""
    config = _config(tmp_path, base_path=f"{BUCKET}/ckpt")
    objects = {f"/fresh-test/ckpt/run/step-10/model/c.{i}": bytes([i]) * 8 for i in range(20)}
    memory_fs.pipe(objects)
    launch = {LAUNCH_ID_ENV: "launch-a"}
    _preempt_after(monkeypatch, memory_fs, copies=7)
    with pytest.raises(Preempted):
        fresh.set_aside_run(config, launch)
    monkeypatch.undo()
    assert fresh.read_intent(config) is not None, "the intent was written before the first move"
    assert len(memory_fs.find("/fresh-test/ckpt/run")) == 13  # the old run, split: 7 moved, 13 not

    moved = fresh.set_aside_run(config, launch)  # the launcher's retry: same command, same launch
    aside = memory_fs.glob("/fresh-test/ckpt/run.old-*")
    assert len(aside) == 1 and [m.removeprefix("memory://").lstrip("/") for m in moved] == [aside[0].lstrip("/")]
    assert sorted(memory_fs.find(aside[0])) == sorted(o.replace("/ckpt/run/", f"/ckpt/{aside[0].split('/')[-1]}/")
                                                      for o in objects)
    assert memory_fs.find("/fresh-test/ckpt/run") == ["/fresh-test/ckpt/run/FRESH_START.json"]
    assert fresh.read_intent(config) is None and fresh.applied_by(config) == "launch-a"
    memory_fs.pipe("/fresh-test/ckpt/run/step-20/metadata.json", b"{}")  # the retry trains on
    assert fresh.set_aside_run(config, launch) == []  # and its next retry resumes it
    assert memory_fs.exists("/fresh-test/ckpt/run/step-20/metadata.json")


def test_a_run_without_fresh_finishes_an_interrupted_set_aside_before_it_resumes(tmp_path, memory_fs, monkeypatch):
    """A later launch, fresh or not, must not resume from half of the old run: it finishes the moves first."""
    memory_fs.pipe({f"/fresh-test/ckpt/run/step-10/c.{i}": b"x" for i in range(6)})
    _preempt_after(monkeypatch, memory_fs, copies=2)
    with pytest.raises(Preempted):
        fresh.set_aside_run(_config(tmp_path, base_path=f"{BUCKET}/ckpt"), {LAUNCH_ID_ENV: "launch-a"})
    monkeypatch.undo()
    resumed = _config(tmp_path, fresh_start=False, base_path=f"{BUCKET}/ckpt")
    assert len(fresh.prepare(resumed, {LAUNCH_ID_ENV: "launch-b"})) == 1
    assert not [p for p in memory_fs.find("/fresh-test/ckpt/run") if "step-10" in p]
    (aside,) = memory_fs.glob("/fresh-test/ckpt/run.old-*")
    assert len(memory_fs.find(aside)) == 6
    assert fresh.prepare(resumed, {LAUNCH_ID_ENV: "launch-b"}) == []


def test_nothing_empty_is_set_aside(tmp_path):
    """A brand-new pod run: the writability probe (the launcher's or the run's) made an empty checkpoint directory.
    On 4cb100e a fresh launch moved it aside as if it were an old run."""
    config = _config(tmp_path)
    Path(checkpoint_dir(config)).mkdir(parents=True)
    assert fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"}) == []
    assert not list(Path(checkpoint_dir(config)).parent.glob("*.old-*"))
    assert fresh.applied_by(config) == "launch-a"  # the marker: the launch's own checkpoints are never set aside


def test_with_a_shared_base_path_only_this_runs_checkpoints_are_set_aside(tmp_path):
    """``append_run_id_to_base_path: false``: the base path is the run's checkpoint directory, and may hold other
    runs' directories and the compilation cache. On 4cb100e fresh moved all of it."""
    base = tmp_path / "shared"
    config = _config(tmp_path, base_path=str(base), append_run_id_to_base_path=False)
    for name in ("step-10", "step-20"):
        (base / name).mkdir(parents=True)
        (base / name / "metadata.json").write_text('{"step": %s, "timestamp": "2026-01-01T00:00:00"}' % name[5:])
    for other in ("other-run/step-5", "compile-cache"):
        (base / other).mkdir(parents=True)
        (base / other / "keep.txt").write_text("not this run's")
    assert discover_latest_checkpoint(str(base)) is not None
    moved = fresh.set_aside_run(config, {})
    assert sorted(Path(m).name for m in moved) == ["step-10", "step-20"]
    (aside,) = base.glob("run.old-*")
    assert sorted(p.name for p in aside.iterdir()) == ["step-10", "step-20"]
    assert (base / "other-run" / "step-5" / "keep.txt").exists() and (base / "compile-cache" / "keep.txt").exists()
    assert discover_latest_checkpoint(str(base)) is None, "the set-aside checkpoints are out of Levanter's sight"


def test_with_a_shared_base_path_each_run_has_its_own_fresh_marker(tmp_path):
    """Issue 46 (6): two runs on one base path (``append_run_id_to_base_path: false``), each started fresh by its own
    launch. On 2cf0d97 they shared ``<base>/FRESH_START.json``: the second run's set-aside moved the first run's marker
    away and wrote its own, and the first launch's retry then set aside the checkpoints it had just trained."""
    base = tmp_path / "shared"
    first = _config(tmp_path, run_id="first", base_path=str(base), append_run_id_to_base_path=False)
    second = _config(tmp_path, run_id="second", base_path=str(base), append_run_id_to_base_path=False)
    fresh.set_aside_run(first, {LAUNCH_ID_ENV: "launch-a"})
    fresh.set_aside_run(second, {LAUNCH_ID_ENV: "launch-b"})
    assert sorted(p.name for p in base.glob("*FRESH_START.json")) == ["first.FRESH_START.json",
                                                                      "second.FRESH_START.json"]  # fmt: skip
    assert (fresh.applied_by(first), fresh.applied_by(second)) == ("launch-a", "launch-b")
    (base / "step-10").mkdir()
    (base / "step-10" / "metadata.json").write_text('{"step": 10, "timestamp": "2026-01-01T00:00:00"}')
    assert fresh.set_aside_run(first, {LAUNCH_ID_ENV: "launch-a"}) == []  # launch a's retry resumes its run
    assert (base / "step-10" / "metadata.json").exists()


def test_a_launch_in_flight_across_the_upgrade_still_finds_its_shared_marker(tmp_path):
    """A marker written by the layout before the upgrade (``<base>/FRESH_START.json``) that names this launch: its
    retry resumes, as it did before."""
    base = tmp_path / "shared"
    config = _config(tmp_path, base_path=str(base), append_run_id_to_base_path=False)
    base.mkdir()
    (base / "FRESH_START.json").write_text('{"launch_id": "launch-a", "set_aside": []}')
    (base / "step-10").mkdir()
    (base / "step-10" / "metadata.json").write_text('{"step": 10, "timestamp": "2026-01-01T00:00:00"}')
    assert fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-a"}) == []
    assert fresh.set_aside_run(config, {LAUNCH_ID_ENV: "launch-b"}) != [], "another launch's fresh still applies"
    assert not (base / "step-10").exists()
