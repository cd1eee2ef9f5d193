"""Every TPU-compiled figure in README.md and docs/ was made by the lock's compiler, and its record names the command
that made it (scripts/stale_tpu_figures.py): a lock move that leaves a figure behind fails here, not in front of a
reader."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


def _script():
    return load_script("stale_tpu_figures")


def test_every_tpu_figure_record_was_made_by_the_locks_compiler_and_names_its_command():
    """The cited benchmark records and every pre-flight record (docs/pods/*.json, docs/pods.md's tables)."""
    script = _script()
    result = script.check(REPO, REPO / "constraints.txt")
    assert result["benchmark_records"] >= 1, "no TPU benchmark figure found: the check would check nothing"
    assert result["records"] > result["benchmark_records"], "no pre-flight record found: the check would skip them"
    assert not result["stale"] and not result["without_command"], script.report(result)
    assert not result["history_on_the_lock"], "cited as an earlier compiler's record, made by the lock's"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_check_finds_cited_tpu_records_of_another_compiler_and_records_without_a_command(tmp_path):
    """A fake repository: what is stale, incomplete or out of scope is told apart."""
    lock = {"jax": "0.10.2", "libtpu": "0.0.42.1"}
    _write(tmp_path / "constraints.txt", "jax==0.10.2\njaxlib==0.10.2\nlibtpu==0.0.42.1\n")
    bench = tmp_path / "docs" / "benchmarks"
    tpu = {"tpu_targets": ["v5e"], "command": "python scripts/bench_optimizer.py --tpu v5e"}
    _write(bench / "current.json", json.dumps({**tpu, "compiler": lock}))
    _write(bench / "old_libtpu.json", json.dumps({**tpu, "compiler": {**lock, "libtpu": "0.0.37"}}))
    _write(bench / "unrecorded.json", json.dumps({"tpu_targets": ["v5e"], "machine": {"jax": "0.7.2"}}))
    _write(bench / "cpu_only.json", json.dumps({"tpu_targets": [], "machine": {"jax": "0.7.2"}}))
    _write(bench / "uncited.json", json.dumps({**tpu, "compiler": {"jax": "0.7.2", "libtpu": "0.0.23"}}))
    _write(tmp_path / "README.md", "1.2x<!-- bench: current.json a/b --> 3<!-- bench: cpu_only.json x -->\n")
    _write(tmp_path / "docs" / "benchmarks.md", "\n".join([
        "<!-- bench-table: old_libtpu.json sizes/size=small/rows -->",
        "passes 12.0 <!-- bench: unrecorded.json a --> and 13.0 <!-- bench: old_libtpu.json b -->",
        "then 9.0 <!-- bench-history: uncited.json c -->",  # an earlier compiler's record, shown as history
    ]))
    pods = tmp_path / "docs" / "pods"
    _write(pods / "a__v4-8.json", json.dumps({"compiler": lock, "command": "python -m levanter_mars.main.preflight"}))
    _write(pods / "b__v4-8.json", json.dumps({"compiler": {"jax": "0.9.2", "libtpu": "0.0.37"}}))

    script = _script()
    result = script.check(tmp_path, tmp_path / "constraints.txt")
    stale = {r["path"]: r for r in result["stale"]}
    assert set(stale) == {"docs/benchmarks/old_libtpu.json", "docs/benchmarks/unrecorded.json",
                          "docs/pods/b__v4-8.json"}, script.report(result)
    assert stale["docs/benchmarks/old_libtpu.json"]["differs"] == ["libtpu 0.0.37 (lock 0.0.42.1)"]
    assert stale["docs/benchmarks/old_libtpu.json"]["cited_in"] == ["docs/benchmarks.md:1", "docs/benchmarks.md:2"]
    assert stale["docs/benchmarks/unrecorded.json"]["differs"] == ["jax 0.7.2 (lock 0.10.2)", "libtpu not recorded"]
    assert stale["docs/pods/b__v4-8.json"]["differs"] == ["jax 0.9.2 (lock 0.10.2)", "libtpu 0.0.37 (lock 0.0.42.1)"]
    assert result["without_command"] == ["docs/benchmarks/unrecorded.json", "docs/pods/b__v4-8.json"]
    assert result["records"] == 5 and result["benchmark_records"] == 3  # cpu_only and uncited are out of scope
    assert "rerun: python scripts/bench_optimizer.py --tpu v5e" in script.report(result)
    assert result["history_on_the_lock"] == []
    # A current record cited as history is found.
    with open(tmp_path / "docs" / "benchmarks.md", "a") as document:
        document.write("\nthen 1.0 <!-- bench-history: current.json x -->\n")
    assert script.check(tmp_path, tmp_path / "constraints.txt")["history_on_the_lock"] == ["docs/benchmarks/current.json"]
