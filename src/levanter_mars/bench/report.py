"""What every benchmark prints: a plain-text table for people, or one JSON object (``--json``) for programs."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from typing import Any, Iterable, Mapping, Sequence



def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (the tables then go to stderr)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (CI): minutes become seconds")
    parser.add_argument(
        "--platform",
        default=None,
        help="JAX platform to run on (cpu, gpu, tpu); default: JAX's choice (the output names the device used)",
    )


def select_platform(platform_name: str | None) -> None:
    """Must run before the first JAX computation."""
    if platform_name:
        os.environ["JAX_PLATFORMS"] = platform_name
        import jax

        jax.config.update("jax_platforms", platform_name)


def host_description() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "host": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        pass
    return info


def record_arguments(doc: str, default_output: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """A record script's command line: ``--output`` (its JSON) and ``--workdir`` (where its runs go; default: a
    temporary directory)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--output", default=default_output)
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temporary directory)")
    return parser.parse_args(argv)


def record_header(what: str, packages: Sequence[str]) -> dict[str, Any]:
    """What every record starts with: what it measured, the command that made it, the versions, the machine."""
    from levanter_mars import versions

    return {"what": what, "command": versions.command_line(),
            "versions": {p: versions.installed(p) for p in packages},
            "levanter_mars": versions.source_commit(), "machine": host_description()}  # fmt: skip


def machine_description() -> dict[str, Any]:
    """Where the numbers were measured: the device JAX used and the host."""
    import jax

    device = jax.devices()[0]
    info: dict[str, Any] = {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        **host_description(),
    }
    try:
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
    except (ImportError, AttributeError):
        pass
    return info


def describe_machine(info: Mapping[str, Any]) -> str:
    return (
        f"device: {info['device_count']} x {info['device_kind']} ({info['platform']}), jax {info['jax']}, "
        f"python {info['python']}, {info['cpu_count']} CPUs ({info['host']})"
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        if abs(value) < 0.1:  # learning rates: 0.0018, not 0.002
            return f"{value:.2g}"
        return f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], title: str = "") -> str:
    """``columns`` are ``(key, header)`` pairs; missing values print as ``-``."""
    header = [h for _, h in columns]
    body = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return _jsonable(value.item())
    return value


def emit(result: Mapping[str, Any], tables: Iterable[str], as_json: bool) -> None:
    """Prints the tables on stdout, or with ``as_json`` the JSON object alone on stdout and the tables on stderr
    (where progress messages go too), so that one run gives both."""
    text = "\n\n".join(tables)
    if as_json:
        print(text, file=sys.stderr, flush=True)
        json.dump(_jsonable(result), sys.stdout, indent=None, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(text)
    sys.stdout.flush()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def goal_line(name: str, measured: float | None, limit: float, unit: str = "x") -> dict[str, Any]:
    """A goal of the form ``measured <= limit``, as reported in tables and JSON."""
    met = None if measured is None or not math.isfinite(measured) else measured <= limit
    return {"goal": name, "measured": measured, "limit": limit, "unit": unit, "met": met}


GOAL_COLUMNS = (("goal", "goal"), ("measured", "measured"), ("limit", "limit"), ("met", "met"), ("note", "note"))
