"""``python -m levanter_mars.main.pretokenize --config_path X [--dry_run true] [--workers N] [--address A]
[--field value ...] [--data.cache_dir gs://... and any training override]`` (``scripts/pretokenize.py`` is the same)

The data step, run before renting accelerators: every token cache the training config needs, built and verified.
A source on the hub or in a dataset folder (``data.configs.X.id``, e.g. FineWeb-Edu) is mirrored into the cache's
storage (each file checked), cut into units of row groups, tokenized by the workers of a Ray cluster (this machine's
CPUs unless ``--address`` names one) into Levanter's cache format, and checked document by document before it is
marked finished. A source of local or bucket URLs is tokenized serially, as training would. Rerunning the command
finishes an interrupted build; a finished one is left as it is.

Exit codes (``pretokenize/errors.py``): 0 built and verified; 2 bad input (the field or file named; nothing
half-written counts as done); 5 storage trouble (the hub or the bucket); 8 another data step is building the same
source; 1 a crash; 130 interrupted.

The program's order: parse the options and the training config; check the sources (listing each dataset, reading
no data), then, with ``--dry_run``, estimate and stop; check the caches against their provenance records and probe
that they can be written; mirror, tokenize, assemble and verify each split; build URL sources' caches serially.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from typing import Optional, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the data step computes nothing on an accelerator

import draccus  # noqa: E402

from levanter_mars.compat.cli import argparse_errors_raise  # noqa: E402
from levanter_mars.pretokenize.errors import exit_code  # noqa: E402
from levanter_mars.pretokenize.options import PretokenizeOptions  # noqa: E402
from levanter_mars.training.config import ConfigError  # noqa: E402

logger = logging.getLogger("levanter_mars.pretokenize")
OPTION_NAMES = {f.name for f in dataclasses.fields(PretokenizeOptions)}


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The step's own options (``--workers 4``, ``--dry_run=true``) and the training config's arguments."""
    own, training = [], []
    argv = list(argv)
    i = 0
    while i < len(argv):
        name = argv[i][2:].split("=", 1)[0] if argv[i].startswith("--") else None
        target = own if name in OPTION_NAMES else training
        target.append(argv[i])
        if name is not None and "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            target.append(argv[i + 1])
            i += 1
        i += 1
    return own, training


def parse(argv: Sequence[str]):
    from levanter_mars.program_config import parse_train_config

    own, training = split_arguments(argv)
    try:
        with argparse_errors_raise(ConfigError):
            options = draccus.parse(PretokenizeOptions, args=own)
    except (draccus.utils.DecodingError, draccus.utils.ParsingError, ValueError) as e:
        raise ConfigError(f"pretokenize option: {e}") from e
    return options, parse_train_config(training)


def run(argv: Sequence[str], report=print) -> int:
    from levanter_mars.pretokenize import steps as sources
    from levanter_mars.training.data import pydocs_corpus

    options, config = parse(argv)
    if config.embedded_corpus:
        pydocs_corpus.prepare(config.embedded_corpus, config.embedded_corpus_sources)
    splits = sources.hub_splits(config.data, options)
    if options.dry_run:
        for line in sources.dry_run(config.data, splits, options):
            report(line)
        return 0
    sources.check_missing_files(config.data)
    sources.check_caches(config.data, splits, options)
    sources.build_hub_splits(splits, options, report)
    built = sources.build_url_sources(config.data)
    for line in sources.summary(config.data):
        report(line)
    if built:
        report("built serially: " + ", ".join(built))
    return 0


def cli(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(sys.argv[1:] if argv is None else list(argv), report=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to finish (finished units are kept)", file=sys.stderr)
        return exit_code(KeyboardInterrupt())
    except Exception as e:  # noqa: BLE001 - mapped to the documented codes; a crash keeps its traceback
        code = exit_code(e)
        if code == 1:
            raise
        label = {2: "config error", 5: "storage error"}.get(code, "error")
        print(f"{label}: {e}", file=sys.stderr)
        return code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(cli())
