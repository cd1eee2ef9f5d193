"""Shared code of the benchmark scripts in ``scripts/``: timing, parameter trees, reports.

Nothing here is imported by training or by the optimizer. The scripts measure; tests only check that they run
(``tests/test_benchmark_scripts.py``); no timing is ever asserted.
"""
