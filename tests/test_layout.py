"""Layout rules, checked over the sources: ``infra/`` and ``bench/`` reach the training program's config
(``levanter_mars.program_config``) without going through ``eval/``, no class is imported under another name (one
name per class wherever it is used), and no module of the package reaches itself through its imports (no import
circle, function-level imports included: tests/helpers/import_graph.py)."""

import ast
from pathlib import Path

from tests.helpers.import_graph import cycles, import_graph, mutual_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "levanter_mars"
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])


def _from_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield ast.ImportFrom(module=alias.name, names=[], level=0, lineno=node.lineno)


def _imports_eval(node: ast.ImportFrom) -> bool:
    module = node.module or ""
    return module == "levanter_mars.eval" or module.startswith("levanter_mars.eval.") or (
        module == "levanter_mars" and any(alias.name == "eval" for alias in node.names)
    )


def test_infra_and_bench_do_not_import_eval():
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}"
        for package in ("infra", "bench")
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for node in _from_imports(path)
        if _imports_eval(node)
    ]
    assert not found, found


def test_no_class_is_imported_under_another_name():
    aliased = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} as {alias.asname}"
        for path in SOURCES
        for node in _from_imports(path)
        for alias in node.names
        if alias.asname and alias.asname != alias.name and alias.name[:1].isupper() and not alias.name.isupper()
    ]
    assert not aliased, aliased


def test_no_two_modules_import_each_other():
    assert not mutual_imports(import_graph(PACKAGE))


def test_no_import_circle_between_modules():
    assert not cycles(import_graph(PACKAGE)), "import circles: " + "; ".join(
        " -> ".join(cycle) for cycle in cycles(import_graph(PACKAGE)))


def test_the_import_graph_sees_function_level_relative_and_from_package_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")  # function level, module named in from
    (package / "sub" / "b.py").write_text("from . import c\n")  # relative
    (package / "sub" / "c.py").write_text("import pkg.a\nimport os\n")
    (package / "d.py").write_text("from pkg.sub.c import something\nfrom pkg import e\n")
    (package / "e.py").write_text("import pkg.d\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert mutual_imports(graph) == [("pkg.d", "pkg.e")]
    assert sorted(cycles(graph)) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"], ["pkg.d", "pkg.e", "pkg.d"]]


def test_the_package_graph_holds_its_known_edges():
    graph = import_graph(PACKAGE)  # a walker that missed imports would pass the rules above for nothing
    assert "levanter_mars.training.distributed" in graph["levanter_mars.training.compilation_cache"]
    assert {"levanter_mars.training.compilation_cache", "levanter_mars.training.distributed"} <= graph[
        "levanter_mars.training.pod_start"]
