"""Layout rules, checked over the sources: ``infra/`` and ``bench/`` reach the training program's config
(``levanter_mars.program_config``) without going through ``eval/``, and no class is imported under another name (one
name per class wherever it is used)."""

import ast
from pathlib import Path

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
