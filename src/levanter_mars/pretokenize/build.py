"""One split of one dataset source, from the dataset's files to a verified cache: mirror, plan, tokenize, assemble,
verify, record. Every step resumes: the mirror's manifest, the plan, each unit's done marker and the cache's ledger
say what is done, so the same command after any kill finishes the build without tokenizing a finished unit again.

What lives where, under the split's cache directory ``<cache>/<split>`` (Levanter's place for it):

* the cache itself (``input_ids/``, ``shard_ledger.json``), ``provenance.json`` (``training/data/provenance``);
* ``build/plan.json`` (the units), ``build/units/<unit>/`` (each unit's tokens until the cache is verified);
* ``verification.json`` (the check, per unit) and ``build.json`` (the record: versions, command, rate, per-unit
  tokens).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from levanter_mars import versions
from levanter_mars.pretokenize.assemble import Assembler, read_ledger, remove_units, write_ledger
from levanter_mars.pretokenize.dataset_repo import DatasetRepo
from levanter_mars.pretokenize.errors import SourceError, StorageTrouble
from levanter_mars.pretokenize.mirror import MirroredFile, join, mirror
from levanter_mars.pretokenize.options import PretokenizeOptions
from levanter_mars.pretokenize.progress import Progress
from levanter_mars.pretokenize.units import Unit, plan_units
from levanter_mars.pretokenize.verify import VerificationFailed, verify
from levanter_mars.pretokenize.worker import TokenizeJob, UnitResult, completed, done_markers, unit_dir
from levanter_mars.training.whole_files import read_json, read_whole, write_whole

logger = logging.getLogger(__name__)

PLAN = "build/plan.json"
UNITS = "build/units"
RECORD = "build.json"
VERIFICATION = "verification.json"


@dataclass(frozen=True)
class SplitSource:
    """A split of one source: the config field it comes from, the dataset, where its cache and mirror go."""

    field: str
    repo: DatasetRepo
    name: Optional[str]
    split: str
    split_dir: str
    mirror_dir: str
    text_key: str
    processor: object
    rebuild: bool = False
    """``data.rebuild_cache``: a build in progress from other files is moved aside (kept) instead of refused."""


@dataclass
class Timings:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, step: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - since
        return now


def build_split(source: SplitSource, files: list, options: PretokenizeOptions, executor: Callable[[], object],
                report: Callable[[str], None], still_mine: Callable[[], None] = lambda: None) -> dict:  # fmt: skip
    """Builds the split's cache from ``files`` (the repository's files for it) with the units' executor that
    ``executor()`` returns (made only if a unit is left to tokenize); returns the build record."""
    timings = Timings()
    start = time.perf_counter()
    mirrored = mirror(source.repo, files, source.mirror_dir, threads=options.mirror_threads, report=report)
    mark = timings.add("mirror", start)
    units = _plan(source, mirrored, options)
    mark = timings.add("plan", mark)
    units_dir = join(source.split_dir, UNITS)
    assembler = Assembler(source.split_dir, source.processor, units, units_dir, options.flush_tokens)
    if assembler.finished:
        if not options.keep_units:
            remove_units(units_dir)  # a build killed between finishing and cleaning up
        report(f"{source.field} {source.split}: the cache at {source.split_dir} is finished and verified")
        return _read_record(source)
    results = _completed_before(units_dir, units)
    todo = [u for u in units[assembler.appended:] if u.name not in results]
    runner = executor() if todo else None
    where = runner.description if runner is not None else "nothing"
    report(f"{source.field} {source.split}: {len(units)} units; {assembler.appended} in the cache, "
           f"{len(results) - assembler.appended} more tokenized before, {len(todo)} to tokenize on {where}")  # fmt: skip
    job = TokenizeJob(source.processor, source.text_key, units_dir, flush_tokens=options.flush_tokens)
    progress = Progress(f"{source.field} {source.split}", units, results, runner.workers if runner else 1,
                        options.progress_s, report)  # fmt: skip
    assembling = 0.0
    for result in (runner.run(todo, job, tick_s=min(options.progress_s, 5.0)) if runner else ()):
        still_mine()  # the build's lease: raises if another data step took the build over
        if result is not None:
            results[result.unit] = result
            progress.unit_done(result)
            before = time.perf_counter()
            assembler.append_ready(results)
            assembling += time.perf_counter() - before
        progress.tick()
    still_mine()
    assembler.append_ready(results)
    progress.stop()
    mark = timings.add("tokenize", mark)
    timings.seconds["assemble_in_tokenize"] = assembling
    checked = _verified(source, units, results, options, units_dir)
    mark = timings.add("verify", mark)
    twice = [u.name for u in units if len(done_markers(units_dir, u.name)) > 1]
    record = _record(source, mirrored, units, results, progress, runner, timings, checked, twice, options)
    # The check and the record are written before the ledger says finished: a kill in between leaves an unfinished
    # cache that a rerun checks again, never a finished one without them.
    write_whole(join(source.split_dir, VERIFICATION), json.dumps({"rows": checked.rows, "tokens": checked.tokens,
                "sampled_documents": checked.sampled_documents, "units": checked.per_unit}, indent=1) + "\n")
    write_whole(join(source.split_dir, RECORD), json.dumps(record, indent=1) + "\n")
    ledger = assembler.finish()
    _loads_as_levanter_does(source, checked.rows)
    if not options.keep_units:
        remove_units(units_dir)
    report(f"{source.field} {source.split}: done: {ledger.total_num_rows:,} documents, {checked.tokens:,} tokens in "
           f"{source.split_dir}; verified (counts, {len(units)} unit digests, {checked.sampled_documents} documents "
           f"tokenized again); record: {join(source.split_dir, RECORD)}")  # fmt: skip
    return record


def _read_record(source: SplitSource) -> dict:
    try:
        return read_json(join(source.split_dir, RECORD)) or {}
    except ValueError as e:
        raise StorageTrouble(str(e)) from None


def _plan(source: SplitSource, mirrored: list[MirroredFile], options: PretokenizeOptions) -> list[Unit]:
    """The stored plan if it was made from these very files (a rerun keeps its units), else a new one. A new plan
    makes every earlier unit's tokens stale (their markers are removed), and a cache that holds anything of the old
    plan is refused, or set aside with ``data.rebuild_cache``."""
    path = join(source.split_dir, PLAN)
    try:
        stored = read_json(path)
    except ValueError as e:
        raise StorageTrouble(f"{e}: remove it to plan the build again") from None
    files = [{"url": f.url, "sha256": f.sha256} for f in mirrored]
    if stored is not None and stored.get("files") == files:
        return [Unit.from_json(u) for u in stored["units"]]
    if stored is not None or read_ledger(source.split_dir) is not None:
        _start_over(source)
    units = plan_units(mirrored, text_key=source.text_key, unit_bytes=options.unit_bytes, field=source.field)
    write_whole(path, json.dumps({"files": files, "unit_bytes": options.unit_bytes,
                                  "units": [u.to_json() for u in units]}, indent=1))  # fmt: skip
    return units


def _start_over(source: SplitSource) -> None:
    from levanter_mars.training.data.provenance import RECORD_FILE

    holds = read_ledger(source.split_dir) is not None or _rows_in_cache(source) > 0
    if holds and not source.rebuild:
        raise SourceError(f"{source.split_dir}: a build in progress there was planned from other files than "
                          f"{source.mirror_dir} holds now (the dataset changed); --data.rebuild_cache true moves it "
                          "aside")  # fmt: skip
    if holds:
        from levanter_mars.training.data.cache_check import set_aside_cache

        record = read_whole(join(source.split_dir, RECORD_FILE))
        logger.warning("data.rebuild_cache=true: moved the build from other files at %s to %s", source.split_dir,
                       set_aside_cache(source.split_dir))  # fmt: skip
        if record is not None:  # what the new build is built from is recorded as before it
            write_whole(join(source.split_dir, RECORD_FILE), record)
    else:
        remove_units(join(source.split_dir, UNITS))  # tokens of an earlier plan's units: stale


def _rows_in_cache(source: SplitSource) -> int:
    """Rows an assembler appended (its ledger may not say so yet: a kill between the two)."""
    import fsspec
    from levanter.store.tree_store import TreeStore

    fs, path = fsspec.core.url_to_fs(join(source.split_dir, "input_ids"))
    if not fs.exists(path):
        return 0
    store = TreeStore.open(source.processor.output_exemplar, source.split_dir, mode="r", cache_metadata=False)
    return store.tree["input_ids"].num_rows


def _verified(source: SplitSource, units: list[Unit], results: dict[str, UnitResult], options: PretokenizeOptions,
              units_dir: str):  # fmt: skip
    try:
        return verify(source.split_dir, source.processor, units, results, text_key=source.text_key,
                      samples=options.verify_samples, all_documents=options.verify_all_documents)  # fmt: skip
    except VerificationFailed as e:
        _cut_from(source.split_dir, units, e.unit_index)
        for unit in units[e.unit_index :]:  # their tokens are suspect: the rerun tokenizes them again
            remove_units(unit_dir(units_dir, unit.name))
        raise StorageTrouble(f"{source.field} {source.split}: the cache failed its check: {e}. The cache was cut back "
                             f"to the units before it, whose tokens are removed: rerun to tokenize them "
                             "again") from None  # fmt: skip


def _loads_as_levanter_does(source: SplitSource, rows: int) -> None:
    from levanter.store.cache import TreeCache

    loaded = TreeCache.load(source.split_dir, source.processor.output_exemplar)
    if len(loaded) != rows:
        raise StorageTrouble(f"{source.split_dir}: Levanter's loader sees {len(loaded)} rows of {rows}")


def _cut_from(split_dir: str, units: list[Unit], index: int) -> None:
    ledger = read_ledger(split_dir)
    if ledger is None:
        return
    kept = [u.name for u in units[:index]]
    ledger.finished_shards = kept
    ledger.total_num_rows = sum(ledger.shard_rows.get(n, 0) for n in kept)
    for unit in units[index:]:
        ledger.shard_rows[unit.name] = 0
    ledger.is_finished = False
    write_ledger(split_dir, ledger)


def _record(source, mirrored, units, results, progress, executor, timings, checked, twice, options) -> dict:
    from levanter_mars.bench.report import host_description

    now = [r for r in results.values() if r.tokenized_now]
    return {
        "record": "pretokenize",
        "command": versions.command_line(),
        "versions": {p: versions.installed(p) for p in ("levanter", "tokenizers", "transformers", "pyarrow", "ray",
                                                        "tensorstore", "jax")} | {"levanter-mars":
                                                                                  versions.source_commit()},
        "machine": host_description(),
        "source": {"field": source.field, "id": source.repo.dataset_id, "name": source.name,
                   "revision": source.repo.revision, "split": source.split,
                   "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in mirrored]},
        "cache": source.split_dir,
        "mirror": source.mirror_dir,
        "executor": executor.description if executor is not None else None,
        "workers": executor.workers if executor is not None else 0,
        "units": len(units),
        "units_tokenized_now": len(now),
        "units_done_before": len(units) - len(now),
        "units_tokenized_twice": twice,
        "documents": checked.rows,
        "tokens": checked.tokens,
        "characters": sum(r.characters for r in results.values()),
        "seconds": timings.seconds,
        "rate": progress.rates(),
        "verification": {"method": "counts against the parquet footers, each unit's digest read back through "
                                   "Levanter's loader, documents tokenized again from the mirror",
                         "sampled_documents": checked.sampled_documents, "file": VERIFICATION},  # fmt: skip
        "per_unit": [{"unit": u.name, "rows": u.rows, "bytes": u.bytes,
                      **{k: getattr(results[u.name], k) for k in ("tokens", "characters", "seconds", "host")},
                      "tokenized_now": results[u.name].tokenized_now} for u in units],  # fmt: skip
        "options": {"unit_bytes": options.unit_bytes, "flush_tokens": options.flush_tokens},
    }


def _completed_before(units_dir: str, units: list[Unit]) -> dict[str, UnitResult]:
    """The results of every unit a worker finished before (its done marker), read 16 at a time."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        found = pool.map(lambda unit: completed(units_dir, unit), units)
    return {unit.name: result for unit, result in zip(units, found) if result is not None}
