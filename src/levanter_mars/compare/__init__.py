"""Optimizer comparisons: fair, tuned, seeded runs of several optimizers on one base run, measured against a baseline
(``python -m levanter_mars.main.compare``)."""
