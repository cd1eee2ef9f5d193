"""Training data: sources and their path checks, token caches and their provenance, the embedded corpus."""
