"""Test-wide settings: CPU only, offline, and any non-loopback connection attempt is a test failure."""

import os
import socket

# Set before jax/transformers/datasets are imported by any test module.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _offline_flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_offline_flag] = "1"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# XLA:CPU programs of the tests compile with LLVM's cheap pipeline (tests/helpers/xla_flags.py says what it changes).
from tests.helpers import xla_flags  # noqa: E402

xla_flags.set_for_this_process()
# Training subprocesses share compiled programs (about 40% of a tiny run is compilation), within a session and across
# sessions on one machine (tests/helpers/compile_cache.py). LEVANTER_MARS_TEST_CACHE=cold starts from an empty cache.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    from pathlib import Path

    from tests.helpers import compile_cache

    if os.environ.get("LEVANTER_MARS_TEST_CACHE") == "cold":
        import atexit
        import shutil
        import tempfile

        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="levanter-mars-jax-cache-")
        atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    else:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(
            compile_cache.session_cache_dir(Path(__file__).parents[1] / "constraints.txt"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# A process that hangs can be asked where (SIGABRT): every child, and the zygote's forks, dump their Python stacks.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

import ipaddress  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest_plugins = ["tests.helpers.durations"]

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_local(address) -> bool:
    if not isinstance(address, tuple):  # unix sockets
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname that would need DNS: treat as remote


class NetworkAccessError(RuntimeError):
    pass


def _guarded_connect(self, address):
    if not _is_local(address):
        raise NetworkAccessError(f"test tried to reach the network: {address!r}")
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    if not _is_local(address):
        raise NetworkAccessError(f"test tried to reach the network: {address!r}")
    return _real_connect_ex(self, address)


#: Each fixture's own time limit: a session fixture that starts runs (tests/conftest.py: reference_runs) is no longer
#: charged to whichever test happens to request it first.
FIXTURE_TIMEOUT_S = 1200


#: Fixtures that build the embedded corpus, start training runs or a storage emulator: a test that uses one (even
#: through another fixture) is ``slow``, so that ``make test-fast`` (``-m "not slow"``) starts none of them.
SLOW_FIXTURES = frozenset({"pydocs_corpus", "reference_runs", "pod_reference", "gcs"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        # pytest-timeout's limit (pyproject.toml: timeout) then times the test function alone, not its fixtures' setup.
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(func_only=True))
        # Simulated 8-device runs live in subprocesses that import and compile everything again.
        uses_slow_fixture = SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
        if (uses_slow_fixture or item.get_closest_marker("multidevice")) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    from tests.helpers.deadline import time_limit

    with time_limit(FIXTURE_TIMEOUT_S, f"fixture {fixturedef.argname!r}"):
        yield


@pytest.fixture(autouse=True, scope="session")
def _no_network():
    socket.socket.connect = _guarded_connect
    socket.socket.connect_ex = _guarded_connect_ex
    yield
    socket.socket.connect = _real_connect
    socket.socket.connect_ex = _real_connect_ex


def _environment_as_before():
    """Each test, and each module's fixtures, end with the environment they started with. Libraries change
    ``os.environ`` as they work in the test process (an in-process TPU compile leaves TPU_LIBRARY_PATH,
    TF_CPP_MIN_LOG_LEVEL, ALLOW_MULTIPLE_LIBTPU_LOAD and TPU_SKIP_MDS_QUERY): kept, they would reach every later
    test's programs and end their forks from the zygote (tests/helpers/zygote.py)."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


_module_environment_as_before = pytest.fixture(autouse=True, scope="module", name="_module_environment_as_before")(
    _environment_as_before)
_test_environment_as_before = pytest.fixture(autouse=True, name="_test_environment_as_before")(_environment_as_before)


def pytest_collection_finish(session):
    from tests.helpers import zygote

    zygote.SESSION_ENVIRONMENT = dict(os.environ)  # what libraries set while test modules were imported included


def pytest_sessionfinish(session):
    from tests.helpers import zygote

    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its tallies go to the controller's summary
        session.config.workeroutput["zygote"] = zygote.counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.helpers import zygote

    if "zygote" in getattr(node, "workeroutput", {}):
        zygote.add_counts(node.workeroutput["zygote"])


def pytest_terminal_summary(terminalreporter):
    from tests.helpers import zygote

    for line in zygote.summary():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def pydocs_corpus(tmp_path_factory):
    """The embedded corpus and tokenizer, built once per test session."""
    from levanter_mars.training.data import pydocs_corpus
    from tests.helpers.shared import once_per_run

    def make(directory):
        pydocs_corpus.prepare(directory)
        return directory

    return once_per_run(tmp_path_factory, "pydocs", make, str, lambda recorded, directory: directory)


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory, pydocs_corpus):
    """Uninterrupted tiny runs, approx and exact: the bitwise reference for every fault-injection test.

    Returns ``{mode: (config_path, completed_process, paths)}``.
    """
    from tests.helpers.shared import once_per_run
    from tests.helpers.training import (REFERENCE_MODES, describe_failure, finished_process, process_record, run_cli,
                                        run_paths, tiny_config)

    def make(workdir):
        runs = {}
        for mode, overrides in REFERENCE_MODES.items():
            config = tiny_config(workdir, pydocs_corpus, f"ref-{mode}", overrides)
            # Every other run of the session is forked from the test zygote (tests/helpers/zygote.py); this one
            # starts as a user's command does, in a fresh interpreter, so the suite trains through that path too.
            proc = run_cli(config, fresh_interpreter=mode == "approx")
            assert proc.returncode == 0, describe_failure(proc)
            runs[mode] = (config, proc, run_paths(workdir, f"ref-{mode}"))
        return runs

    def record(runs):
        return {mode: [str(config), process_record(proc)] for mode, (config, proc, _) in runs.items()}

    def restore(recorded, workdir):
        return {mode: (Path(config), finished_process(proc), run_paths(workdir, f"ref-{mode}"))
                for mode, (config, proc) in recorded.items()}

    return once_per_run(tmp_path_factory, "reference", make, record, restore)


@pytest.fixture(scope="session")
def pod_reference(tmp_path_factory, pydocs_corpus):
    """The tiny config (approx, with the offline eval suite at the end) as a local pod of 2 processes x 2 simulated
    devices started through the CLI (tests/helpers/pod.py): the reference of every multi-process test.

    Returns ``(config_path, pod, paths)``.
    """
    from tests.helpers.evals import include_suite
    from tests.helpers.pod import PodRun, run_pod
    from tests.helpers.shared import once_per_run
    from tests.helpers.training import run_paths, tiny_config

    def make(workdir):
        config = include_suite(tiny_config(workdir, pydocs_corpus, "pod-approx"))
        pod = run_pod(config, log_dir=workdir / "logs", name="pod-approx")
        assert [p.returncode for p in pod.procs] == [0, 0], pod.describe()
        return config, pod, run_paths(workdir, "pod-approx")

    def record(made):
        config, pod, _ = made
        return [str(config), pod.record()]

    def restore(recorded, workdir):
        config, pod = recorded
        return Path(config), PodRun.restore(pod), run_paths(workdir, "pod-approx")

    return once_per_run(tmp_path_factory, "pod-reference", make, record, restore)


@pytest.fixture(scope="session")
def gcs():
    """A local GCS (gcp-storage-emulator on 127.0.0.1, in memory) for the whole session; see tests/helpers/gcs.py.
    Processes reach it through ``gcs.env`` only."""
    from tests.helpers.gcs import gcs_emulator

    with gcs_emulator() as emulator:
        yield emulator


@pytest.fixture
def gs(gcs, monkeypatch):
    """gcsfs in this process, on the emulator (anonymous, as the CLI subprocesses are)."""
    import fsspec
    import gcsfs

    for name, value in gcs.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
    gcsfs.GCSFileSystem.clear_instance_cache()
    yield fsspec.filesystem("gs")
    gcsfs.GCSFileSystem.clear_instance_cache()
