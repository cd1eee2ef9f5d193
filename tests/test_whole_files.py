"""One way to write a file whole (training/whole_files.py): a reader sees the old content or the new, never part, on
local disk (temporary name, fsync, ``os.replace``) and on object storage (one put). Every module that rewrites a file
whole goes through it: a writer stopped before its swap leaves the previous file as it was, and nothing beside it."""

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import fsspec
import pytest

from levanter_mars.compare import outputs
from levanter_mars.compare import layout, records, run_configs
from levanter_mars.training import whole_files
from levanter_mars.training.checkpointing import manifest
from levanter_mars.training.checkpointing.storage import MANIFEST_NAME
from levanter_mars.training.data import provenance, pydocs_corpus
from levanter_mars.training.run import fresh
from levanter_mars.training.run.goodput import record as goodput
from levanter_mars.training.run.metrics import JsonlMetricsTracker, read_metrics
from levanter_mars.training.whole_files import write_whole

SRC = Path(__file__).resolve().parent.parent / "src" / "levanter_mars"


class Killed(Exception):
    """What a kill between the write and the swap would leave: the swap never happens."""


def _kill_at_the_swap(monkeypatch) -> None:
    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(os, "replace", killed)


def test_a_file_is_written_whole_replacing_the_old_and_creating_its_directory(tmp_path):
    target = tmp_path / "a" / "b" / "file.json"
    write_whole(target, "first")
    write_whole(str(target), b"second \xe2\x9c\x93")
    assert target.read_text() == "second \u2713"
    assert os.listdir(target.parent) == ["file.json"]


def test_a_write_stopped_before_its_swap_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "file.json"
    write_whole(target, "old")
    _kill_at_the_swap(monkeypatch)
    with pytest.raises(Killed):
        write_whole(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["file.json"]


def test_on_object_storage_it_is_one_put(monkeypatch):
    fs = fsspec.filesystem("memory")
    puts = []
    pipe_file = type(fs).pipe_file
    monkeypatch.setattr(type(fs), "pipe_file", lambda self, path, value, **kw: (puts.append(path),
                                                                                pipe_file(self, path, value, **kw)))
    try:
        write_whole("memory://whole-files-test/dir/file.json", "text")
        assert fs.cat("/whole-files-test/dir/file.json") == b"text"
        assert puts == ["/whole-files-test/dir/file.json"]
    finally:
        fs.rm("/whole-files-test", recursive=True)


def _metrics_tracker(path: Path) -> JsonlMetricsTracker:
    tracker = JsonlMetricsTracker(path)
    for step in range(3):
        tracker.log({"loss": 1.0 / (step + 1)}, step=step)
    tracker.flush()
    return tracker


def _summary(metrics_path: Path) -> None:
    tracker = JsonlMetricsTracker(metrics_path)
    tracker.log_summary({"final": 1.0})
    tracker.finish()


def _comparison_outputs(directory: Path) -> None:
    with mock.patch.object(outputs, "markdown", lambda summary: "| table |\n"), \
         mock.patch.object(outputs, "plot", lambda summary, path: path):  # fmt: skip
        outputs.write_all({"comparison": "c"}, str(directory))


def _record(rid: str) -> records.RunRecord:
    return records.RunRecord(run_id=rid, arm="mars", point={"lr": 0.1}, seed=0, status="ok", exit_code=0,
                                  config_digest="d", seconds=1.0, where="local", log="x.log")  # fmt: skip


# Each writer of a whole file, given a directory: (the file, its first version, the write that replaces it).
WRITERS = {
    "fresh marker": lambda d: (
        d / fresh.FRESH_MARKER, "{}", lambda: fresh._write_json(str(d / fresh.FRESH_MARKER), {"launch_id": "x"})),
    "goodput record": lambda d: (
        d / goodput.GOODPUT_FILENAME, "{}",
        lambda: goodput.write_record(d / goodput.GOODPUT_FILENAME, {"attempts": []})),
    "metrics truncated on resume": lambda d: (
        d / "metrics.jsonl", "".join(f'{{"step": {i}}}\n' for i in range(3)),
        lambda: JsonlMetricsTracker(d / "metrics.jsonl").truncate_after(0)),
    "metrics summary": lambda d: (d / "summary.json", "{}", lambda: _summary(d / "metrics.jsonl")),
    "checkpoint manifest": lambda d: (d / MANIFEST_NAME, "{}", lambda: manifest.write_manifest(str(d), step=1)),
    "corpus split": lambda d: (d / "train.jsonl", "", lambda: pydocs_corpus._write_jsonl(d / "train.jsonl", ["a"])),
    "cache provenance": lambda d: (
        d / provenance.RECORD_FILE, "{}", lambda: provenance.write_record(str(d), {"source": "x"})),
    "comparison outputs": lambda d: (d / "compare.json", "{}", lambda: _comparison_outputs(d)),
    "comparison run record": lambda d: (
        d / "records" / "r.json", "{}",
        lambda: records.write_record(layout.Layout(str(d), ""), _record("r"))),
    "comparison run config": lambda d: (
        d / "configs" / "r.yaml", "a: 0\n",
        lambda: run_configs.write_config(layout.Layout(str(d), ""), "r", {"a": 1})),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_writer_stopped_before_its_swap_leaves_the_previous_file_whole(name, tmp_path, monkeypatch):
    target, first, write = WRITERS[name](tmp_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(first)
    (tmp_path / "data.bin").write_bytes(b"a checkpoint's file")  # what a manifest covers
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with monkeypatch.context() as m:
        _kill_at_the_swap(m)
        with pytest.raises(Killed):
            write()
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, f"{name}: a write stopped before its swap changed a file or left one behind"
    write()
    assert target.read_bytes() != before[target]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_the_rewritten_files_keep_their_format(tmp_path):
    tracker = _metrics_tracker(tmp_path / "metrics.jsonl")
    tracker.truncate_after(1)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"loss": 1.0, "step": 0}\n{"loss": 0.5, "step": 1}\n'
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]
    tracker.log({"loss": 0.25}, step=2)
    tracker.log_summary({"final": 0.25})
    tracker.finish()  # appends after the rewrite
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert (tmp_path / "summary.json").read_text() == '{\n  "final": 0.25\n}\n'
    texts = ["plain", "unicode \u2713", 'quote "and" newline\n']
    digest = pydocs_corpus._write_jsonl(tmp_path / "train.jsonl", texts)
    assert digest == hashlib.sha256((tmp_path / "train.jsonl").read_bytes()).hexdigest()
    assert [json.loads(line)["text"] for line in (tmp_path / "train.jsonl").open(encoding="utf-8")] == texts
    assert "\u2713" in (tmp_path / "train.jsonl").read_text(encoding="utf-8")  # ensure_ascii=False, as before
    goodput.write_record(tmp_path / "goodput.json", {"attempts": []})
    assert (tmp_path / "goodput.json").read_text() == '{\n "attempts": []\n}\n'
    provenance.write_record(str(tmp_path), {"source": "x"})
    assert provenance.read_record(str(tmp_path)) == {"source": "x"}


def test_object_storage_writers_go_through_the_same_put(tmp_path):
    fs = fsspec.filesystem("memory")
    root = "memory://whole-files-writers"
    try:
        fresh._write_json(f"{root}/ckpt/FRESH_START.json", {"launch_id": "x"})
        assert json.loads(fs.cat("/whole-files-writers/ckpt/FRESH_START.json")) == {"launch_id": "x"}
        provenance.write_record(f"{root}/cache/train", {"source": "x"})
        assert provenance.read_record(f"{root}/cache/train") == {"source": "x"}
        fs.pipe("/whole-files-writers/step-1/metadata.json", b"{}")
        written = manifest.write_manifest(f"{root}/step-1", step=1)
        assert json.loads(fs.cat(f"/whole-files-writers/step-1/{MANIFEST_NAME}")) == written
        assert list(written["files"]) == ["metadata.json"]
        assert not [p for p in fs.find("/whole-files-writers") if p.endswith(".tmp")]
    finally:
        fs.rm("/whole-files-writers", recursive=True)


def test_no_module_hand_rolls_its_own_swap():
    """``os.replace`` is whole_files' alone: a module that needs a file written whole calls ``write_whole``."""
    allowed = {Path(whole_files.__file__).resolve()}
    hand_rolled = [f"{p.relative_to(SRC.parent)}:{n}" for p in sorted(SRC.rglob("*.py")) if p.resolve() not in allowed
                   for n, line in enumerate(p.read_text().splitlines(), 1) if "os.replace(" in line]  # fmt: skip
    assert not hand_rolled, hand_rolled


@pytest.mark.parametrize("size", [10, 6 << 20])  # below gcsfs's first block (no upload started yet), and past it
def test_a_stream_that_fails_leaves_no_object_in_a_bucket(gs, gcs, size):
    import gc

    from levanter_mars.training.whole_files import open_whole

    url = gcs.gs("whole-files", f"failed-{size}.bin")
    with pytest.raises(RuntimeError):
        with open_whole(url) as f:
            f.write(b"x" * size)
            raise RuntimeError("the copy stops")
    gc.collect()  # a file object collected would still close, and put what it holds
    assert not gs.exists(url)
    with open_whole(url) as f:
        f.write(b"whole")
    assert gs.cat(url) == b"whole"


def test_a_stream_that_fails_leaves_no_object_in_memory():
    from levanter_mars.training.whole_files import open_whole

    fs = fsspec.filesystem("memory")
    with pytest.raises(RuntimeError):
        with open_whole("memory://whole-files-stream/partial.bin") as f:
            f.write(b"partial")
            raise RuntimeError("the copy stops")
    assert not fs.exists("/whole-files-stream/partial.bin")
