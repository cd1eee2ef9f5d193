"""The test zygote (tests/helpers/zygote.py) serves every test, not only the one that started it: pytest changes
PYTEST_CURRENT_TEST for each test, and a variable compared between the zygote's environment and a child's sends the
child to a fresh interpreter (the suite then re-imports jax, Levanter, transformers and Ray about a hundred times)."""

import subprocess

import pytest

from tests.helpers import zygote
from tests.helpers.training import REPO, _env

pytestmark = pytest.mark.slow  # starts the zygote: its imports take seconds


def _child_of_the_zygote() -> None:
    if not zygote.ENABLED:
        pytest.skip("LEVANTER_MARS_TEST_FORK=0: every program runs in a fresh interpreter, by request")
    proc = zygote.popen(["-c", "import sys; sys.exit(7)"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    assert isinstance(proc, zygote.ForkedProcess), "a fresh interpreter, not a fork of the zygote"
    assert proc.wait(timeout=60) == 7


def test_a_child_is_forked_from_the_zygote():
    _child_of_the_zygote()


def test_a_later_test_still_forks_from_the_same_zygote():
    _child_of_the_zygote()
