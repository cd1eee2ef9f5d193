"""Each test reproduces a defect of a pinned dependency that a piece of levanter_mars.compat works around.

When one of these starts failing, upstream has fixed the defect: delete the workaround and this test. One file per
compat module, named after it (``test_<module>*.py``: the defect index's rows point here, test_defect_index.py
checks that they do)."""
