"""Benchmark figures in README.md and docs/ are the numbers of the benchmark JSON they cite.

A figure is followed by ``<!-- bench: FILE PATH -->``: FILE under docs/benchmarks/, PATH a ``/``-separated walk into
it where a list is entered by index (``goals/0``) or by the item whose field has a value (``sizes/size=small``). The
figure must be the JSON value rounded to the decimals shown.
"""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "docs" / "benchmarks"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The figure: the last number before the comment, with at most a unit and markdown emphasis in between.
FIGURE = re.compile(r"(\d+(?:\.\d+)?)(?:\*\*|[×x]|\s|MiB|GiB|ms|bytes/param)*<!-- bench: (\S+) (\S+) -->")
RATIO = re.compile(r"\d+(?:\.\d+)?\s?[×x]\b")


def _lookup(data, path: str):
    for segment in path.split("/"):
        if isinstance(data, list):
            if "=" in segment:
                field, value = segment.split("=", 1)
                matches = [item for item in data if str(item.get(field)) == value]
                assert len(matches) == 1, f"{segment!r} selects {len(matches)} items"
                data = matches[0]
            else:
                data = data[int(segment)]
        else:
            data = data[segment]
    return data


def _figures():
    for document in DOCUMENTS:
        for line_number, line in enumerate(document.read_text().splitlines(), 1):
            for match in FIGURE.finditer(line):
                yield pytest.param(document, match, id=f"{document.name}:{line_number}:{match.group(1)}")


@pytest.mark.parametrize("document,match", list(_figures()))
def test_figure_is_the_benchmark_json_value(document, match):
    shown, file, path = match.groups()
    value = _lookup(json.loads((BENCHMARKS / file).read_text()), path)
    decimals = len(shown.partition(".")[2])
    assert abs(float(value) - float(shown)) <= 0.5 * 10**-decimals + 1e-12, (
        f"{document.name} shows {shown} for {file} {path}, which is {value}"
    )


def test_figures_are_cited_in_readme_and_benchmarks_page():
    cited = {match.group(2) for _, match, *_ in (p.values for p in _figures())}
    assert {"step_cpu.json", "optimizer_cpu_small_medium.json", "convergence.json"} <= cited, cited


def test_every_ratio_in_readme_benchmarks_section_cites_its_json():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    uncited = [m.group(0) for m in RATIO.finditer(FIGURE.sub("", section))]
    assert not uncited, f"README's benchmark figures without <!-- bench: ... -->: {uncited}"
