"""An earlier version of this project's optimizers, imported beside the current one, to time both in one run.

A change to the optimizer is judged against the previous code on the same machine in the same minutes: the
benchmarks' ``--baseline-ref REF`` adds, for each of our optimizers selected, the same optimizer as of git ``REF``
(named ``name@REF``). The package ``levanter_mars.optim`` at ``REF`` is read from this checkout's git history (no
network) into a temporary directory and imported under the same module names with ``sys.modules`` swapped for the
duration of the import; the optimizers built from it keep their own module globals after the swap is undone.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

PACKAGE = "levanter_mars"
OPTIM = f"{PACKAGE}.optim"


def _repository() -> Path:
    here = Path(__file__).resolve().parent
    result = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"--baseline-ref needs a git checkout of levanter-mars; {here} is not in one")
    return Path(result.stdout.strip())


def _extract(ref: str, destination: Path) -> None:
    repository = _repository()
    archive = subprocess.run(
        ["git", "-C", str(repository), "archive", "--format=tar", ref, f"src/{PACKAGE}"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--baseline-ref {ref!r}: git archive failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(f"{PACKAGE}.")


@contextlib.contextmanager
def _levanter_choices_kept():
    """The earlier package registers its own ``mars-*`` config classes with Levanter's ``OptimizerConfig`` as it is
    imported, under the names the current package holds (draccus refuses a second class for a name): the current
    registrations are set aside for the import and put back after it."""
    try:
        from levanter.optim import OptimizerConfig
    except ImportError:
        yield
        return
    choices = OptimizerConfig.get_known_choices()  # draccus hands out the registry itself
    kept = dict(choices)
    for name in [name for name, cls in choices.items() if _ours(cls.__module__)]:
        del choices[name]
    try:
        yield
    finally:
        choices.clear()
        choices.update(kept)


@functools.cache
def load_optim(ref: str) -> ModuleType:
    """``levanter_mars.optim`` as of git ``ref`` (read and imported once per process); the current modules are back in
    place when this returns."""
    temporary = tempfile.mkdtemp(prefix=f"levanter-mars-{ref.replace('/', '_')}-")
    atexit.register(shutil.rmtree, temporary, ignore_errors=True)  # its modules stay imported until exit
    source = Path(temporary) / "tree"
    _extract(ref, source)
    current = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in current:
        del sys.modules[name]
    sys.path.insert(0, str(source / "src"))
    try:
        with _levanter_choices_kept():
            return importlib.import_module(OPTIM)
    finally:
        sys.path.remove(str(source / "src"))
        for name in [name for name in sys.modules if _ours(name)]:
            del sys.modules[name]
        sys.modules.update(current)
