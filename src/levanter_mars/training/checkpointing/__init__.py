"""Checkpointing: checkpoints written with a manifest, audited, quarantined when bad, and the resume plan."""
