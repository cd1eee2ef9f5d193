"""tests/helpers/shared.py: a session fixture is made once per test run, however many pytest-xdist workers ask."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.helpers.shared import once_per_run


class _WorkerTemp:
    """A worker's ``tmp_path_factory``: its base temp is inside the run's directory, as pytest-xdist makes it."""

    def __init__(self, run_dir, worker):
        self.base = run_dir / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self):
        return self.base


def _restore(recorded, directory):
    assert recorded == str(directory), "the record is what the maker made, in the directory every worker sees"
    return recorded.upper()


def _ask_from_workers(tmp_path, monkeypatch, make, workers=("gw0", "gw1", "gw2")):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    factories = [_WorkerTemp(tmp_path, w) for w in workers]
    with ThreadPoolExecutor(len(factories)) as pool:
        futures = [pool.submit(once_per_run, f, "thing", make, str, _restore) for f in factories]
        return [f.exception() or f.result() for f in futures]


def test_the_first_worker_makes_it_once_and_the_others_read_its_record(tmp_path, monkeypatch):
    made = []

    def make(directory):
        made.append(threading.get_ident())
        time.sleep(0.5)  # the others ask meanwhile, and wait
        (directory / "product").write_text("x")
        return str(directory)

    results = _ask_from_workers(tmp_path, monkeypatch, make)
    assert len(made) == 1
    assert sorted(results) == sorted([str(tmp_path / "thing")] + [str(tmp_path / "thing").upper()] * 2)
    assert (tmp_path / "thing" / "product").exists()


def test_a_failed_make_fails_every_worker_with_the_makers_traceback(tmp_path, monkeypatch):
    calls = []

    def make(directory):
        calls.append(1)
        raise ValueError("the reference run exited 1")

    results = _ask_from_workers(tmp_path, monkeypatch, make)
    assert len(calls) == 1, "a failure is not retried by the next worker"
    errors = sorted(results, key=lambda e: type(e).__name__)
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError, ValueError]
    assert all("the reference run exited 1" in str(e) for e in errors[:2])


def test_without_workers_the_run_directory_is_the_base_temp(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _WorkerTemp(tmp_path, "solo")
    assert once_per_run(factory, "thing", lambda d: str(d), str, _restore) == str(factory.base / "thing")
