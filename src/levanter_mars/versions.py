"""What a record of a compiled figure names: the versions it depends on and the command that made it. TPU figures move
with libtpu (and jax's lowering), so every record of one names them, and a record made with other versions than the
lock's (``constraints.txt``) is stale until its command is run again (scripts/stale_tpu_figures.py)."""

from __future__ import annotations

import re
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

#: The packages that decide what the TPU compiler produces.
COMPILER_PACKAGES = ("jax", "libtpu")


def installed(package: str) -> Optional[str]:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def compiler_versions() -> dict[str, Optional[str]]:
    """``{"jax": ..., "libtpu": ...}`` as installed here (None where absent)."""
    return {package: installed(package) for package in COMPILER_PACKAGES}


def locked_versions(constraints: Path) -> dict[str, str]:
    """The pins of :data:`COMPILER_PACKAGES` in a pip constraints file (``name==version`` lines); a package the
    file does not pin raises ``ValueError`` naming the file."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", constraints.read_text(), flags=re.MULTILINE))
    missing = [p for p in COMPILER_PACKAGES if p not in pins]
    if missing:
        raise ValueError(f"{constraints} pins no version of {', '.join(missing)}")
    return {p: pins[p] for p in COMPILER_PACKAGES}


def command_line() -> str:
    """The command that made a record, as run: ``python -m module`` or ``python script`` (relative to the working
    directory when under it), with its arguments, quoted for a shell."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        program = ["-m", spec.name.removesuffix(".__main__")]
    else:
        script = Path(sys.argv[0])
        try:
            script = script.resolve().relative_to(Path.cwd())
        except ValueError:
            pass
        program = [str(script)]
    return shlex.join(["python", *program, *sys.argv[1:]])


def source_commit() -> Optional[str]:
    """The short commit id of the checkout this package runs from (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
