"""The ``installed`` embedded corpus, read from a site-packages directory made here (two distributions with their
dist-info, as pip writes it): each distribution's description and docstrings, tests and vendored code left out, a
docstring already in the corpus (another distribution's, or the standard library's) never repeated, and the
distributions' pins in the corpus's fingerprint."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from levanter_mars.training.data import pydocs_corpus

LONG = "Computes the thing that this function computes, carefully, for every input it accepts."


def _install(site: Path, name: str, version: str, files: dict[str, str], description: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n{description}\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    record = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def _module(doc: str, function_doc: str) -> str:
    return f'"""{doc}"""\n\ndef f():\n    """{function_doc}"""\n'


@pytest.mark.slow  # reads the standard library's sources twice
def test_installed_documents_come_from_each_distribution_once(tmp_path):
    site = tmp_path / "site-packages"
    stdlib_json_doc = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "__init__.py").read_text().split('"""')[1]
    _install(site, "Beta_Pkg", "2.0", {
        "beta_pkg/__init__.py": _module("The beta package, a second one, with docs of its own here.", LONG),
        "beta_pkg/tests/test_x.py": _module("A test module that must not be in the corpus at all.", "x" * 50),
        "beta_pkg/_vendor/six.py": _module("A vendored copy of another distribution's code, left out.", "y" * 50),
        "beta_pkg/copied.py": _module(stdlib_json_doc, "A docstring only the beta package has, long enough."),
    }, "Beta: the README of the beta distribution, several words long.")  # fmt: skip
    _install(site, "alpha", "1.0", {
        "alpha/core.py": _module("The alpha package's core module, documented at some length.", LONG),
    }, "Alpha's README, which is long enough to be kept in the corpus.")  # fmt: skip

    documents = dict(pydocs_corpus.iter_documents("installed", site_dirs=[str(site)]))
    installed = {name: text for name, text in documents.items() if not name.startswith(("stdlib/", "topics/"))}
    assert list(installed) == ["alpha/DESCRIPTION", "alpha/alpha/core.py", "beta-pkg/DESCRIPTION",
                               "beta-pkg/beta_pkg/__init__.py", "beta-pkg/beta_pkg/copied.py"]  # fmt: skip
    assert LONG in installed["alpha/alpha/core.py"]
    assert LONG not in installed["beta-pkg/beta_pkg/__init__.py"]  # alpha has it already
    assert stdlib_json_doc.strip() not in installed["beta-pkg/beta_pkg/copied.py"]  # the stdlib has it already
    assert "only the beta package has" in installed["beta-pkg/beta_pkg/copied.py"]
    # The stdlib part is the stdlib corpus itself, unchanged by the other source.
    stdlib = dict(pydocs_corpus.iter_documents("stdlib"))
    assert {k: v for k, v in documents.items() if k in stdlib} == stdlib

    pins = pydocs_corpus._distribution_pins("installed", [str(site)])
    assert pins == ["alpha==1.0", "beta-pkg==2.0"]
    other = pydocs_corpus._fingerprint("installed", ["alpha==1.1", "beta-pkg==2.0"])
    assert pydocs_corpus._fingerprint("installed", pins) != other  # another version: another corpus
    assert "sources" not in pydocs_corpus._fingerprint("stdlib")  # corpora built before sources existed stay valid
    json.dumps(pydocs_corpus._fingerprint("installed", pins))
