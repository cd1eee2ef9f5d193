"""The compat index (``levanter_mars.compat.DEFECTS``): every row names the installed version, a workaround and a
reproducing test that exist, a test in tests/compat/ is in the file named after its workaround's module, and every
defect a compat module cites has a row."""

import importlib.metadata

from levanter_mars.compat import levanter_training
from tests.helpers.processes import REPO


def _node_exists(node_id: str) -> bool:
    import ast

    path, function = node_id.split("::")
    file = REPO / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body)


def _workaround_exists(name: str) -> bool:
    import importlib

    if (REPO / name).is_file():
        return True
    parts = f"levanter_mars.{name}".split(".")
    for split in range(len(parts), 1, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_compat_entry_names_the_installed_version_a_workaround_and_a_reproducing_test_that_exist():
    from levanter_mars.compat import DEFECTS

    numbers = [d.number for d in DEFECTS]
    assert len(numbers) == len(set(numbers)), numbers
    for defect in DEFECTS:
        package, version = defect.upstream.split("==")
        installed = ".".join(map(str, __import__("sys").version_info[:2])) if package == "python" else (
            importlib.metadata.version(package)
        )
        assert installed == version, (defect.number, defect.upstream, installed)
        assert _workaround_exists(defect.workaround), (defect.number, defect.workaround)
        assert _node_exists(defect.test), (defect.number, defect.test)
        assert f"defect_{defect.number}_" in defect.test or defect.number == 17, (defect.number, defect.test)


def test_every_defect_the_compat_modules_cite_is_in_the_index():
    import re
    from pathlib import Path

    from levanter_mars.compat import DEFECTS

    listed = {d.number for d in DEFECTS}
    package = Path(levanter_training.__file__).parent
    cited = set()
    for module in package.glob("*.py"):
        for group in re.findall(r"[Dd]efects? ([\d, and]+)", module.read_text()):
            cited.update(int(n) for n in re.findall(r"\d+", group))
    assert cited <= listed, sorted(cited - listed)
    assert cited, "no module cites a defect: the pattern is stale"


def test_a_rows_test_in_tests_compat_is_in_the_file_named_after_its_workarounds_module():
    from levanter_mars.compat import DEFECTS

    misplaced = []
    for defect in DEFECTS:
        path = defect.test.split("::")[0]
        if not (path.startswith("tests/compat/") and defect.workaround.startswith("compat.")):
            continue  # a workaround outside compat/ (pyproject.toml, the trainer), or a test beside what it tests
        stem, module = path.removeprefix("tests/compat/").removesuffix(".py"), defect.workaround.split(".")[1]
        if stem != f"test_{module}" and not stem.startswith(f"test_{module}_"):
            misplaced.append((defect.number, defect.workaround, defect.test))
    assert not misplaced, misplaced
