"""Memory traffic of a compiled program, read from XLA itself: a timer-free figure for memory-bound updates.

An optimizer update is memory-bound, so its cost is the number of parameter-sized passes over memory. XLA's cost
analysis counts the bytes every top-level operation of the optimized program reads and writes; divided by the bytes
of the parameters in float32 it gives that number of passes (AdamW after a global clip makes about 18 on XLA:CPU).
Copies are the operations XLA inserted to keep a donated buffer's old value alive while the new one is written:
each is a parameter-sized read and write, plus as much scratch memory. Staging is XLA:TPU moving an array between
memory spaces (``copy-start``/``copy-done``: a prefetch into on-chip memory, or an eviction from it): the bytes
accessed count its read and its write, although the array crosses HBM once and its users then read it where it was
staged, so ``bytes accessed - 2 * staging bytes`` is the program's traffic as if nothing had been staged.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

#: ``%name = f32[3,4]{1,0} op(...)`` in the optimized HLO text: name, element type, dims, layout, op, first operand.
_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\](\{[^}]*\})?\s+([\w\-]+)\(%?([\w.\-]*)")


def _dtype_bytes(name: str) -> int:
    """f32 -> 4, bf16 -> 2, s8 -> 1, f8e4m3fn -> 1, pred -> 1: HLO element types name their bit width first."""
    bits = re.search(r"\d+", name)
    return max(1, int(bits.group()) // 8) if bits else 1


def _entry(hlo_text: str) -> str:
    entry = hlo_text[hlo_text.find("\nENTRY") :]
    return entry[: entry.find("\n}")]


def _bytes(dtype: str, dims: str) -> int:
    return math.prod(int(d) for d in dims.split(",") if d) * _dtype_bytes(dtype)


#: ``%copy-start.1 = (f32[3,4]{...S(1)}, f32[3,4]{...}, u32[]{...}) copy-start(%x)``: the staged array comes first.
_STAGING = re.compile(r"\s*%?[\w.\-]+\s*=\s*\((\w+)\[([\d,]*)\].*\)\s+copy-start\(")


def entry_staging(hlo_text: str) -> list[int]:
    """Byte sizes of the arrays the entry computation stages between memory spaces (one per ``copy-start``)."""
    found = (_STAGING.match(line) for line in _entry(hlo_text).splitlines())
    return [_bytes(*match.groups()) for match in found if match is not None]


def entry_copies(hlo_text: str) -> list[int]:
    """Byte sizes of the buffer copies in the entry computation of an optimized HLO module.

    A buffer copy is a ``copy`` of an array that keeps its operand's layout; one that changes the layout is a
    transpose (e.g. before a matrix product), and a scalar's (a loop counter's) moves no buffer: neither is counted.
    """
    layouts, sizes = {}, []
    for line in _entry(hlo_text).splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, dtype, dims, layout, op, operand = match.groups()
        layouts[name] = layout
        if op == "copy" and dims and layouts.get(operand, layout) == layout:
            sizes.append(_bytes(dtype, dims))
    return sizes


def traffic(compiled: Any) -> dict[str, Optional[float]]:
    """``bytes_accessed`` (XLA's cost analysis), the number and bytes of buffer copies of ``compiled``, and the bytes
    it stages between memory spaces (each counted twice in ``bytes_accessed``)."""
    try:
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        accessed = float(analysis["bytes accessed"])
    except Exception:  # noqa: BLE001 - not every backend implements it
        accessed = None
    try:
        text = compiled.as_text()
        copies, staged = entry_copies(text), entry_staging(text)
    except Exception:  # noqa: BLE001
        copies = staged = None
    return {
        "bytes_accessed": accessed,
        "copies": None if copies is None else len(copies),
        "copy_bytes": None if copies is None else sum(copies),
        "staging_bytes": None if staged is None else sum(staged),
    }
