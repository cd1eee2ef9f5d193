#!/usr/bin/env python
"""Builds the token caches a training config needs, before training (and before renting accelerators).

    python scripts/pretokenize.py --config_path config/gpt2_small_mars.yaml [--data.cache_dir gs://bucket/path]

Local JSONL sources are tokenized serially in this process (identical to what training would build). Remote and
Hugging Face sources (FineWeb-Edu) go through Levanter's own cache builder, which uses Ray and resumes where it left
off if interrupted; run it on a CPU machine with a large disk or next to the bucket. It needs network access to the
HF hub and to the cache_dir bucket; nothing else here does.
"""

from __future__ import annotations

import logging
import sys

from levanter_mars.training.data import cache_check
from levanter_mars.training.data import sources as data_lib
from levanter_mars.training.data import pydocs_corpus
from levanter_mars.program_config import parse_train_config
from levanter_mars.training.config import ConfigError


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = parse_train_config(argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if config.embedded_corpus:
        pydocs_corpus.prepare(config.embedded_corpus, config.embedded_corpus_sources)
    problems = data_lib.missing_data_paths(config.data)
    if problems:
        print("config error: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        cache_check.check_and_prepare(config.data)  # refuses caches built from other sources; records new ones
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    built = data_lib.build_local_caches(config.data)
    for split in data_lib.SPLITS:
        caches = config.data.build_caches(split)  # loads what exists, builds the rest (Levanter, Ray)
        for name, cache in caches.items():
            print(f"{split}{'/' + name if name else ''}: {len(cache.as_sync_dataset())} documents in {cache.cache_dir}")
    if built:
        print("built serially: " + ", ".join(built))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
