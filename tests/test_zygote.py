"""The test zygote (tests/helpers/zygote.py) serves every test, not only the one that started it: pytest changes
PYTEST_CURRENT_TEST for each test, and a variable compared between the zygote's environment and a child's sends the
child to a fresh interpreter (the suite then re-imports jax, Levanter, transformers and Ray about a hundred times).
A child's PYTHONPATH is honoured: one that would import a preloaded module from elsewhere is not forked."""

import os
import subprocess

import pytest

from tests.helpers import zygote
from tests.helpers.training import REPO, _env

pytestmark = pytest.mark.slow  # starts the zygote: its imports take seconds


def _start_child():
    if not zygote.ENABLED:
        pytest.skip("LEVANTER_MARS_TEST_FORK=0: every program runs in a fresh interpreter, by request")
    return zygote.popen(["-c", "import sys; sys.exit(7)"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)


def _child_of_the_zygote() -> None:
    proc = _start_child()
    differences = zygote._ZYGOTE.differences(_env()) if zygote._ZYGOTE else "no zygote"
    assert isinstance(proc, zygote.ForkedProcess), f"a fresh interpreter, not a fork of the zygote: {differences}"
    assert proc.wait(timeout=60) == 7


def test_a_child_is_forked_from_the_zygote():
    _child_of_the_zygote()


def test_a_variable_a_library_sets_in_the_test_process_does_not_outlive_its_test():
    _child_of_the_zygote()
    os.environ["LEVANTER_MARS_LEFT_BY_A_LIBRARY"] = "1"  # as libtpu's loader leaves TPU_LIBRARY_PATH
    proc = _start_child()  # this test's own programs see it, in a fresh interpreter: the zygote was started without
    assert not isinstance(proc, zygote.ForkedProcess)
    assert proc.wait(timeout=120) == 7


def test_a_later_test_still_forks_from_the_same_zygote():
    assert "LEVANTER_MARS_LEFT_BY_A_LIBRARY" not in os.environ
    _child_of_the_zygote()


def test_the_zygote_is_the_sessions_environment_not_the_first_programs(monkeypatch):
    """A variable a library set in the test process while the zygote started (the test that started it happened to
    build a dataset) is not the reference of every later program: the zygote's environment is the session's."""
    if not zygote.ENABLED:
        pytest.skip("LEVANTER_MARS_TEST_FORK=0: every program runs in a fresh interpreter, by request")
    assert zygote.SESSION_ENVIRONMENT is not None
    monkeypatch.setattr(zygote, "_ZYGOTE", None)  # this test starts a zygote of its own; the session's is kept
    os.environ["LEVANTER_MARS_LEFT_BY_A_LIBRARY"] = "1"
    polluted = zygote.popen(["-c", "import sys; sys.exit(7)"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started = zygote._ZYGOTE
    try:
        assert polluted.wait(timeout=120) == 7
        assert not isinstance(polluted, zygote.ForkedProcess)  # it differs from the session: a fresh interpreter
        del os.environ["LEVANTER_MARS_LEFT_BY_A_LIBRARY"]
        later = zygote.popen(["-c", "import sys; sys.exit(7)"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        assert isinstance(later, zygote.ForkedProcess), started.differences(_env())
        assert later.wait(timeout=60) == 7
    finally:
        started.close()


def test_a_child_parses_the_training_config_without_reading_class_sources_again():
    """Draccus reads every config field's help from its class's source (inspect: about 1 CPU-second a program): the
    zygote reads it once, before it forks, and a child that parses the training config reads no class source."""
    if not zygote.ENABLED:
        pytest.skip("LEVANTER_MARS_TEST_FORK=0: every program runs in a fresh interpreter, by request")
    code = (
        "import sys\n"
        "from draccus.wrappers.docstring import _get_class_source\n"
        "from levanter_mars.program_config import parse_train_config\n"
        "before = _get_class_source.cache_info().misses\n"
        "parse_train_config(['--config_path', sys.argv[1]])\n"
        "print('read before:', before, 'while parsing:', _get_class_source.cache_info().misses - before)\n"
    )
    proc = zygote.run(["-c", code, str(REPO / "config" / "gpt2_tiny_mars.yaml")], cwd=REPO, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, parsing = (int(n) for n in proc.stdout.replace("read before:", "").split("while parsing:"))
    assert before > 50 and parsing == 0, proc.stdout


def _with_first_on_path(directory) -> dict:
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(directory), env["PYTHONPATH"]])
    return env


def test_a_child_whose_pythonpath_shadows_a_preloaded_module_runs_in_a_fresh_interpreter(tmp_path):
    """A stand-in package first on PYTHONPATH, named like one the zygote imported: a fork would run the zygote's, so
    the child runs in a fresh interpreter, which imports the stand-in, and the session's summary says why."""
    if not zygote.ENABLED:
        pytest.skip("LEVANTER_MARS_TEST_FORK=0: every program runs in a fresh interpreter, by request")
    (tmp_path / "levanter_mars").mkdir()
    (tmp_path / "levanter_mars" / "__init__.py").write_text("STAND_IN = True\n")
    code = "import sys, levanter_mars; sys.exit(7 if getattr(levanter_mars, 'STAND_IN', False) else 3)"
    before = zygote.FRESH[frozenset({"PYTHONPATH (shadows levanter_mars)"})]
    proc = zygote.popen(["-c", code], cwd=REPO, env=_with_first_on_path(tmp_path), stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    assert not isinstance(proc, zygote.ForkedProcess)
    assert proc.wait(timeout=120) == 7, "the child imported the zygote's levanter_mars, not its PYTHONPATH's"
    assert zygote.FRESH[frozenset({"PYTHONPATH (shadows levanter_mars)"})] == before + 1


def test_a_child_whose_pythonpath_only_adds_modules_is_forked_and_finds_them(tmp_path):
    """A PYTHONPATH entry that shadows nothing preloaded: forked, the entry ahead of the standard library, as a fresh
    interpreter has it."""
    (tmp_path / "levanter_mars_zygote_probe.py").write_text("FOUND = True\n")
    code = ("import os, sys, levanter_mars_zygote_probe\n"
            f"ahead = sys.path.index({str(tmp_path)!r}) < sys.path.index(os.path.dirname(os.__file__))\n"
            "sys.exit(7 if ahead and levanter_mars_zygote_probe.FOUND else 3)")
    env = _with_first_on_path(tmp_path)
    proc = zygote.popen(["-c", code], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if zygote.ENABLED:
        assert isinstance(proc, zygote.ForkedProcess), zygote._ZYGOTE.shadowed(env["PYTHONPATH"], str(REPO))
    assert proc.wait(timeout=120) == 7
