"""The data step's own options, beside the training config it reads (``--config_path X [--field value ...]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PretokenizeOptions:
    dry_run: bool = False
    """Print the sources, files, bytes, an estimate of tokens and hours; contact only the dataset's listing and one
    file's first rows; build nothing."""
    estimate_for: str = "v4-32"
    """The dry run's hours: a TPU slice type (its hosts' CPUs), ``n2-standard-32`` (a GCE VM's vCPUs), or a number of
    CPUs."""
    workers: Optional[int] = None
    """Tokenizing workers, one CPU each (default: every CPU of the Ray cluster, or of this machine)."""
    address: Optional[str] = None
    """A running Ray cluster's GCS address (``host:6379``; ``auto`` on one of its nodes; the local pod's is
    ``127.0.0.1:<gcs_port>`` of its ``levanter_mars_cluster.json``); none: a Ray of ``workers`` CPUs here."""
    serial: bool = False
    """Tokenize in this process, one unit after another (no Ray)."""
    mirror_dir: Optional[str] = None
    """Where a hub dataset's files are copied (default: ``<source's cache dir>/mirror``)."""
    mirror_threads: int = 4
    unit_bytes: int = 256 * 10**6
    """Row groups per unit of work: about this many uncompressed bytes."""
    flush_tokens: int = 8 << 20
    """Tokens a worker holds before writing them, and the assembler appends at a time."""
    verify_samples: int = 3
    """Documents of each unit read again from the source and tokenized again by the check."""
    verify_all_documents: bool = False
    """The check tokenizes every document again (as long as the build itself, in one process)."""
    progress_s: float = 15.0
    """Seconds between progress lines."""
    keep_units: bool = False
    """Keep the units' tokenized files after the build (they are removed once the cache is verified)."""
