"""Downstream evaluation with lm-evaluation-harness: suites, the in-training hook, standalone runs, tables."""
