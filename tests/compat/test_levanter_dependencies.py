"""Defect 6: packages the pinned Levanter imports without declaring them, which pyproject.toml declares instead."""

import importlib.metadata
import inspect


def test_defect_6_chex_and_gitpython_are_undeclared_but_imported():
    requirements = " ".join(importlib.metadata.requires("levanter") or []).lower()
    assert "chex" not in requirements and "gitpython" not in requirements
    import levanter.optim.mars as levanter_mars_module
    import levanter.tracker.helpers as helpers

    assert "import chex" in inspect.getsource(levanter_mars_module)
    assert "git" in inspect.getsource(helpers).lower()
