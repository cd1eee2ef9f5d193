"""The ``branch`` fixture: a test that takes it runs twice, once with each branch of ``jax.lax.platform_dependent``.

On a CPU ``platform_dependent`` always takes its ``cpu=`` branch, so the form XLA:TPU and every other platform run
would never run here (docs/testing.md, "a branch that never runs here"). Import the fixture into a test module to use
it.
"""

import jax
import pytest


@pytest.fixture(params=["cpu", "default"])
def branch(request, monkeypatch):
    """Which branch of ``platform_dependent`` runs: XLA:CPU's (this machine's), or ``default``, the one XLA:TPU and
    every other platform take, run here by calling it in place of ``jax.lax.platform_dependent``."""
    if request.param == "default":
        monkeypatch.setattr(jax.lax, "platform_dependent", lambda *args, cpu, default: default(*args))
    jax.clear_caches()  # jit's traces are kept per function, whichever branch they were traced with
    yield request.param
    jax.clear_caches()
