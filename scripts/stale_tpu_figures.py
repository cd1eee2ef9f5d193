"""Lists the TPU-compiled figures in README.md and docs/ whose record was made by another compiler than the lock's.

A figure the TPU compiler produced (bytes accessed, temporaries, a pre-flight's memory) moves with libtpu and jax's
lowering: libtpu 0.0.23 and 0.0.42.1 gave the same update different pass counts (docs/benchmarks.md). So every such figure is a record
that names the jax and libtpu that made it and the command that made it, and when the lock (``constraints.txt``)
moves, the records made with the old versions are stale until that command is rerun.

In scope:

* every benchmark JSON under docs/benchmarks/ that README.md or a page of docs/ cites (``<!-- bench: FILE ... -->``
  or ``<!-- bench-table: FILE ... -->``) and that holds TPU figures (its ``tpu_targets`` are not empty): its
  ``compiler`` (``{"jax": ..., "libtpu": ...}``) and ``command``. A figure cited as ``<!-- bench-history: ... -->``
  is a record of an earlier compiler shown as such (docs/benchmarks.md's history sections), not in scope;
* every pre-flight record under docs/pods/ (docs/pods.md's tables and the configs' pre-flight lines are generated
  from them): its ``compiler`` and ``command``.

A record is stale when its jax or libtpu differs from the lock's or is not recorded, and incomplete when it names no
command. Exit 0 when there is neither, 1 otherwise. CI (tests/test_stale_tpu_figures.py) holds every record in scope
to it.

    python scripts/stale_tpu_figures.py [--constraints constraints.txt] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from levanter_mars.versions import COMPILER_PACKAGES, locked_versions  # noqa: E402

CITATION = re.compile(r"<!-- bench(?:-table)?: (\S+\.json) ")
HISTORY = re.compile(r"<!-- bench-history: (\S+\.json) ")


@dataclasses.dataclass
class Record:
    path: str
    """Relative to the repository."""
    compiler: Optional[dict]
    command: Optional[str]
    cited_in: list[str]
    """``document:line`` of every figure citing it (benchmark records)."""

    def differences(self, lock: dict[str, str]) -> list[str]:
        """How its compiler differs from ``lock``'s: ``"libtpu 0.0.37 (lock 0.0.42.1)"``, ``"libtpu not recorded"``."""
        found = []
        for package in COMPILER_PACKAGES:
            recorded = (self.compiler or {}).get(package)
            if recorded is None:
                found.append(f"{package} not recorded")
            elif recorded != lock[package]:
                found.append(f"{package} {recorded} (lock {lock[package]})")
        return found


def documents(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def benchmark_records(repo: Path) -> list[Record]:
    """The cited benchmark JSONs that hold TPU figures."""
    cited: dict[str, list[str]] = {}
    for document in documents(repo):
        for number, line in enumerate(document.read_text().splitlines(), 1):
            for name in CITATION.findall(line):
                places = cited.setdefault(name, [])
                place = f"{document.relative_to(repo)}:{number}"
                if place not in places:
                    places.append(place)
    records = []
    for name, places in sorted(cited.items()):
        data = json.loads((repo / "docs" / "benchmarks" / name).read_text())
        if data.get("tpu_targets"):
            records.append(Record(f"docs/benchmarks/{name}", _compiler(data), data.get("command"), places))
    return records


def history_on_the_lock(repo: Path, lock: dict[str, str]) -> list[str]:
    """Records cited as history (``bench-history:``) that the lock's compiler made: a current figure shown as an
    earlier compiler's would escape this check."""
    names = sorted({name for document in documents(repo) for name in HISTORY.findall(document.read_text())})
    found = []
    for name in names:
        compiler = _compiler(json.loads((repo / "docs" / "benchmarks" / name).read_text())) or {}
        if all(compiler.get(package) == lock[package] for package in COMPILER_PACKAGES):
            found.append(f"docs/benchmarks/{name}")
    return found


def _compiler(data: dict) -> Optional[dict]:
    if "compiler" in data:
        return data["compiler"]
    machine = data.get("machine") or {}  # records from before the compiler was recorded: jax alone
    return {"jax": machine["jax"]} if "jax" in machine else None


def preflight_records(repo: Path) -> list[Record]:
    records = []
    for path in sorted((repo / "docs" / "pods").glob("*.json")):
        data = json.loads(path.read_text())
        records.append(Record(str(path.relative_to(repo)), data.get("compiler"), data.get("command"), []))
    return records


def check(repo: Path, constraints: Path) -> dict[str, Any]:
    """``{"lock", "records", "stale", "without_command"}``; stale and incomplete records as dicts."""
    lock = locked_versions(constraints)
    records = benchmark_records(repo) + preflight_records(repo)
    stale = [{**dataclasses.asdict(r), "differs": r.differences(lock)} for r in records if r.differences(lock)]
    without_command = [r.path for r in records if not r.command]
    return {"lock": lock, "records": len(records), "benchmark_records": sum(r.path.startswith("docs/benchmarks")
            for r in records), "stale": stale, "without_command": without_command,
            "history_on_the_lock": history_on_the_lock(repo, lock)}


def report(result: dict[str, Any]) -> str:
    lock = ", ".join(f"{k} {v}" for k, v in result["lock"].items())
    lines = [f"{result['records']} TPU figure records ({result['benchmark_records']} benchmark, "
             f"{result['records'] - result['benchmark_records']} pre-flight); lock: {lock}"]
    stale = result["stale"]
    lines.append(f"{len(stale)} stale (made with another compiler than the lock's):")
    for record in stale:
        cited = f"; cited in {', '.join(record['cited_in'])}" if record["cited_in"] else ""
        command = f"\n    rerun: {record['command']}" if record["command"] else ""
        lines.append(f"  {record['path']}: {'; '.join(record['differs'])}{cited}{command}")
    lines.append(f"{len(result['without_command'])} naming no command that made them:")
    lines += [f"  {path}" for path in result["without_command"]]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--constraints", type=Path, default=REPO / "constraints.txt")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    result = check(REPO, args.constraints)
    print(json.dumps(result) if args.json else report(result))
    return 1 if result["stale"] or result["without_command"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
