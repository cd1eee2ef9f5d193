"""The data step on Ray under ``kill -9`` (extended: each starts a local Ray and builds twice): a worker killed in the
middle of a unit (Ray runs the unit again; the build ends 0), and the driver killed in the middle of the build (the
rerun finishes it). Either way no finished unit is tokenized twice and the cache equals Levanter's own serial cache.
The pieces are in CI: tests/test_pretokenize.py (a killed serial driver resumes, two Ray workers equal the serial
build)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.first_mile import cache_arrays, hub_config, levanter_reference, make_standin
from tests.helpers.processes import REPO
from tests.helpers.training import POLL_S

pytestmark = [pytest.mark.extended, pytest.mark.slow]


@pytest.fixture(scope="module")
def material(tmp_path_factory, pydocs_corpus):
    root = tmp_path_factory.mktemp("kills")
    folder = root / "fineweb-edu"
    make_standin(folder, pydocs_corpus, files=6, row_group_rows=32, documents=None)
    reference = cache_arrays(str(levanter_reference(hub_config(root, pydocs_corpus, str(folder)),
                                                    root / "levanter-serial" / "train")))  # fmt: skip
    return folder, reference


def _start(config, *extra):
    command = [sys.executable, "-m", "levanter_mars.main.pretokenize", "--config_path", str(config), "--workers", "2",
               "--unit_bytes", "100000", "--progress_s", "2", *extra]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ""}
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def _markers(split_dir):
    return sorted((split_dir / "build" / "units").glob("*/done-*.json"))


def _wait_for(predicate, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(POLL_S)
    return False


def _workers():
    out = subprocess.run(["pgrep", "-f", "ray::tokenize_unit_on_worker"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_worker_killed_in_the_middle_of_a_unit_costs_only_that_unit(tmp_path, pydocs_corpus, material):
    folder, reference = material
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    split_dir = tmp_path / "cache" / "fineweb_edu" / "train"
    build = _start(config)
    assert _wait_for(lambda: len(_markers(split_dir)) >= 2 and _workers()), "no unit finished"
    victim, finished_then = _workers()[0], len(_markers(split_dir))
    os.kill(victim, signal.SIGKILL)
    out, err = build.communicate(timeout=600)
    assert build.returncode == 0, err[-3000:]
    record = json.loads((split_dir / "build.json").read_text())
    print(f"worker {victim} killed with {finished_then} of {record['units']} units done: exit {build.returncode}, "
          f"units tokenized twice {record['units_tokenized_twice']}")  # fmt: skip
    assert record["units_tokenized_twice"] == [] and record["units_tokenized_now"] == record["units"]
    offsets, tokens = cache_arrays(str(split_dir))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])


def test_a_driver_killed_in_the_middle_of_the_build_is_finished_by_the_rerun(tmp_path, pydocs_corpus, material):
    folder, reference = material
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    split_dir = tmp_path / "cache" / "fineweb_edu" / "train"
    build = _start(config)
    assert _wait_for(lambda: len(_markers(split_dir)) >= 3), "no unit finished"
    os.kill(build.pid, signal.SIGKILL)  # the driver alone, as a kill -9 of it does
    build.communicate(timeout=60)
    done_before = {m.parent.name for m in _markers(split_dir)}
    assert _wait_for(lambda: not _workers(), timeout=60), "Ray's workers outlived their driver"
    rerun = _start(config)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    record = json.loads((split_dir / "build.json").read_text())
    print(f"driver killed with {len(done_before)} of {record['units']} units done; the rerun: exit {rerun.returncode}, "
          f"{record['units_tokenized_now']} tokenized, {record['units_done_before']} found done, twice "
          f"{record['units_tokenized_twice']}")  # fmt: skip
    assert record["units_tokenized_twice"] == []
    assert record["units_done_before"] >= len(done_before) and record["units_tokenized_now"] == \
        record["units"] - record["units_done_before"]  # fmt: skip
    offsets, tokens = cache_arrays(str(split_dir))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])


def test_sigterm_stops_a_ray_build_with_exit_130_and_leaves_no_ray_process(tmp_path, pydocs_corpus, material):
    """Ray's own SIGTERM handler would abort the driver (exit 134) and leave its daemons; the data step's stop runs
    instead: exit 130, Ray shut down, and the rerun finishes."""
    folder, reference = material
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    split_dir = tmp_path / "cache" / "fineweb_edu" / "train"
    build = _start(config)
    assert _wait_for(lambda: len(_markers(split_dir)) >= 1), "no unit finished"
    os.kill(build.pid, signal.SIGTERM)
    out, err = build.communicate(timeout=120)
    assert build.returncode == 130, err[-3000:]
    assert "interrupted: rerun the same command to finish" in err
    assert _wait_for(lambda: not _workers(), timeout=60), "Ray's workers outlived the stop"
    rerun = _start(config)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    offsets, tokens = cache_arrays(str(split_dir))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])
