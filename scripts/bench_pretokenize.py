#!/usr/bin/env python
"""The data step's throughput against the tokenizer's own, in one run on this machine:

    python scripts/bench_pretokenize.py [--copies 4] [--workers 1 2] [--out docs/benchmarks/pretokenize_throughput.json]

A FineWeb-Edu stand-in is made from the embedded ``installed`` corpus (its documents ``--copies`` times, 8 files per
copy) with a byte-level BPE of GPT-2's size (50,257 tokens) trained on the same text. The baseline is the tokenizer's
own batch encoding of exactly those documents (``tokenizers``' ``encode_batch``, batches of 1,024, one thread), timed
before and after the builds in this process. Each build is the data step as a user runs it (``python -m
levanter_mars.main.pretokenize``, a fresh cache, Ray with N workers): its tokenizing phase (reading the mirror,
tokenizing with Levanter's processor, writing units, assembling the cache meanwhile) in tokens per second per
worker, against the baseline: the ratio; beside it the rate inside the units (the workers' own seconds in them: no
start-up or scheduling) and the whole command's (Ray's start, the mirror, the check). Times are measured, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def baseline(tokenizer_dir: Path, texts: list[str], batch: int = 1024) -> dict:
    """The tokenizer's own batch encoding, one thread: tokens per second over every document."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), batch):
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(texts[i : i + batch]))
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}


def build(config: Path, cache: Path, workers: int, unit_bytes: int) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    command = [sys.executable, "-m", "levanter_mars.main.pretokenize", "--config_path", str(config),
               "--data.cache_dir", str(cache), "--workers", str(workers), "--unit_bytes", str(unit_bytes)]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"build with {workers} worker(s) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    record = json.loads((cache / "fineweb_edu" / "train" / "build.json").read_text())
    stored = sum(f.stat().st_size for f in (cache / "fineweb_edu" / "train" / "input_ids").rglob("*") if f.is_file())
    return {"cache_bytes": stored, "cache_bytes_per_token": stored / record["tokens"],"workers": workers, "command_seconds": wall, "rate": record["rate"], "seconds": record["seconds"],
            "units": record["units"], "tokens": record["tokens"], "executor": record["executor"],
            "per_unit_tokens": [u["tokens"] for u in record["per_unit"]]}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--unit_bytes", type=int, default=8 * 10**6)
    parser.add_argument("--workdir", default=None, help="keeps the stand-in and tokenizer between runs")
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "pretokenize_throughput.json"))
    args = parser.parse_args(argv)

    from levanter_mars import versions
    from levanter_mars.bench.report import host_description
    from levanter_mars.pretokenize.standin import StandinConfig, documents, write_standin
    from levanter_mars.training.data import pydocs_corpus

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pretokenize-"))
    corpus = REPO / ".cache" / "pydocs-installed"
    pydocs_corpus.prepare(corpus, "installed")
    texts = documents(str(corpus / "train.jsonl")) * args.copies
    standin, tokenizer = work / "standin", work / "tokenizer"
    if not (standin / "README.md").exists():
        shape = write_standin(str(standin), texts, (StandinConfig("sample-100BT", "sample/100BT", 8 * args.copies),),
                              row_group_rows=256)  # fmt: skip
        (work / "shape.json").write_text(json.dumps(shape))
    if not (tokenizer / "tokenizer.json").exists():
        pydocs_corpus.train_tokenizer(texts[: len(texts) // args.copies], tokenizer, vocab_size=50257)
    shape = json.loads((work / "shape.json").read_text())
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"tokenizer": str(tokenizer), "cache_dir": str(work / "cache"),
                 "configs": {"fineweb_edu": {"id": str(standin), "name": "sample-100BT"}},
                 "train_weights": {"fineweb_edu": 1.0}},
        "trainer": {"ray": {"auto_start_cluster": False}},
    }))  # fmt: skip

    before = baseline(tokenizer, texts)
    print(f"baseline (tokenizers' encode_batch, 1 thread): {before['tokens_per_second'] / 1e6:.3f}M tokens/s")
    builds = []
    for workers in args.workers:
        result = build(config, work / f"cache-{workers}", workers, args.unit_bytes)
        builds.append(result)
        print(f"build, {workers} worker(s): {result['rate']['tokens_per_second_per_worker'] / 1e6:.3f}M tokens/s per "
              f"worker while tokenizing, command {result['command_seconds']:.1f} s")  # fmt: skip
    after = baseline(tokenizer, texts)
    reference = (before["tokens_per_second"] + after["tokens_per_second"]) / 2
    for result in builds:
        per_worker = result["rate"]["tokens_per_second_per_worker"]
        result["ratio_per_core"] = per_worker / reference
        result["whole_command_tokens_per_second_per_worker"] = result["tokens"] / result["command_seconds"] / \
            result["workers"]  # fmt: skip
        result["whole_command_ratio_per_core"] = result["whole_command_tokens_per_second_per_worker"] / reference
        result["unit_ratio_per_core"] = result["rate"]["unit_tokens_per_second"] / reference
        print(f"{result['workers']} worker(s): {result['ratio_per_core']:.3f}x the tokenizer's rate per core "
              f"(inside its units {result['unit_ratio_per_core']:.3f}x; whole command "
              f"{result['whole_command_ratio_per_core']:.3f}x)")  # fmt: skip
    record = {
        "record": "pretokenize_throughput",
        "command": versions.command_line(),
        "versions": {p: versions.installed(p) for p in ("tokenizers", "transformers", "levanter", "pyarrow", "ray",
                                                        "tensorstore", "jax", "libtpu")}
                    | {"levanter-mars": versions.source_commit()},  # fmt: skip
        "machine": host_description(),
        "standin": shape,
        "copies": args.copies,
        "tokenizer": {"kind": "byte-level BPE trained on the stand-in's text", "vocab_size": 50257},
        "documents": len(texts),
        "goal": "per core, the build's tokenizing >= 0.8x the tokenizer's own batch encoding",
        "baseline": {"method": "tokenizers.Tokenizer.encode_batch, batches of 1024, TOKENIZERS_PARALLELISM=false, "
                               "every document, in the benchmark's process, before and after the builds",
                     "before": before, "after": after, "tokens_per_second": reference},  # fmt: skip
        "builds": builds,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
