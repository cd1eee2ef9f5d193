"""Memory traffic of a compiled program, read from XLA itself: a timer-free figure for memory-bound updates.

An optimizer update is memory-bound, so its cost is the number of parameter-sized passes over memory. XLA's cost
analysis counts the bytes every top-level operation of the optimized program reads and writes; divided by the bytes
of the parameters in float32 it gives that number of passes (AdamW after a global clip makes about 18 on XLA:CPU).
Copies are the operations XLA inserted to keep a donated buffer's old value alive while the new one is written:
each is a parameter-sized read and write, plus as much scratch memory. Staging is XLA:TPU moving an array between
memory spaces (``copy-start``/``copy-done``: a prefetch into on-chip memory, or an eviction from it): the bytes
accessed count its read and its write, although the array crosses HBM once and its users then read it where it was
staged. XLA:TPU stages whole arrays (``copy-start``) and slices of a layer-stacked array that it (libtpu 0.0.37 and
0.0.42) reassembles in place (``slice-start`` and a ``ConcatBitcast``).

:func:`own_traffic` is the other side: the bytes the program's own operations read and write (every fusion, copy,
custom call and the body of every loop, counted once as XLA's cost analysis counts a loop), staging left out. It is
an estimate, operands and results at their full size, but on the update of GPT-2 small it comes out at the passes
the update must make (AdamW: 8.00 on v5e, its one reduction pass and its one update pass), and it says which
operations make the rest of XLA's figure. :func:`hbm_traffic` estimates what crosses between HBM and the chip: the
program's own operations' operands and results that live in HBM (memory space 0; an operand staged on chip is read
there), plus each staged array once. Staging moves traffic out of HBM, while XLA's figure counts it on top.
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
#: ``%slice-start.2 = ((f32[12,768,3072]{...}), f32[3,768,3072]{...S(1)}, s32[]{...}) slice-start(%x), slice=...``:
#: the source in a tuple of its own, then the staged slice.
_SLICE_STAGING = re.compile(r"\s*%?[\w.\-]+\s*=\s*\(\(.*?\),\s*(\w+)\[([\d,]*)\].*\)\s+slice-start\(")


def entry_staging(hlo_text: str) -> list[int]:
    """Byte sizes of the arrays the entry computation stages between memory spaces (one per ``copy-start`` or
    ``slice-start``)."""
    sizes = []
    for line in _entry(hlo_text).splitlines():
        match = _STAGING.match(line) or _SLICE_STAGING.match(line)
        if match is not None:
            sizes.append(_bytes(*match.groups()))
    return sizes


#: An array of an HLO type, with its layout (and memory space) where the type gives one.
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\{\s*$")
_LINE = re.compile(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\(.*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?)\s+([\w\-]+)\((.*?)\)(?:,|$)")
#: Operations that move no bytes of their own, or that stage (the staging is counted by entry_staging).
_NOT_OWN = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
            "replica-id", "copy-start", "copy-done", "slice-start", "slice-done", "while"}


def _type_bytes(hlo_type: str, *, hbm_only: bool = False) -> int:
    """Bytes of the arrays of ``hlo_type``; ``hbm_only``: of those that live in HBM, memory space 0, the default
    (``S(1)`` is on-chip)."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(hlo_type):
        space = re.search(r"S\((\d+)\)", layout) if hbm_only else None
        if dtype != "token" and (space is None or space.group(1) == "0"):
            total += _bytes(dtype, dims)
    return total


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """``{name: instruction lines}`` of every computation, and the entry computation's name."""
    computations, entry, lines = {}, "", None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header:
            lines = computations.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            lines = None
        elif lines is not None:
            lines.append(line)
    return computations, entry


def _instructions(hlo_text: str):
    """``(line, hlo_type, op, operand types, in_loop)`` of every instruction of the entry computation and, in place
    of each ``while``, of its body (once, as XLA's cost analysis counts a loop)."""
    computations, entry = _computations(hlo_text)

    def walk(name: str, in_loop: bool):
        types = {}
        for line in computations.get(name, []):
            match = _LINE.match(line)
            if match is None:
                continue
            result, hlo_type, op, operands = match.groups()
            types[result] = hlo_type
            if op == "while":
                yield from walk(re.search(r"body=%([\w.\-]+)", line).group(1), True)
            operand_types = [types.get(o, "") for o in re.findall(r"%([\w.\-]+)", operands)]
            yield line, hlo_type, op, operand_types, in_loop

    yield from walk(entry, False)


def _moves_no_bytes(line: str, op: str) -> bool:
    return op in _NOT_OWN or (op == "custom-call" and "ConcatBitcast" in line)


def hbm_traffic(hlo_text: str) -> int:
    """Bytes between HBM and the chip, as the memory spaces of the optimized program place them: what its own
    operations read from and write to HBM (an operand staged on chip is read there), plus each staged array once
    (a prefetch reads it from HBM, an eviction writes it there). Loop bodies once, as :func:`own_traffic`."""
    total = 0
    for line, hlo_type, op, operand_types, _ in _instructions(hlo_text):
        if op in ("copy-start", "slice-start"):  # a prefetch or an eviction: the staged array, once
            staged = _STAGING.match(line) or _SLICE_STAGING.match(line)
            total += _bytes(*staged.groups()) if staged else 0
        elif not _moves_no_bytes(line, op):
            total += _type_bytes(hlo_type, hbm_only=True) + sum(_type_bytes(t, hbm_only=True) for t in operand_types)
    return total


def own_traffic(hlo_text: str) -> dict[str, int]:
    """Bytes read and written by the program's own operations (module docstring), by kind: ``fusion``, ``copy``,
    ``loop`` (the operations of loop bodies) and ``other``."""
    found = {"fusion": 0, "copy": 0, "loop": 0, "other": 0}
    for line, hlo_type, op, operand_types, in_loop in _instructions(hlo_text):
        if not _moves_no_bytes(line, op):
            moved = _type_bytes(hlo_type) + sum(_type_bytes(t) for t in operand_types)
            found["loop" if in_loop else op if op in ("fusion", "copy") else "other"] += moved
    return found


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
    """``bytes_accessed`` (XLA's cost analysis), the number and bytes of buffer copies of ``compiled``, the bytes it
    stages between memory spaces, the bytes its own operations move (:func:`own_traffic`) and the bytes it moves
    between HBM and the chip (:func:`hbm_traffic`)."""
    try:
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        accessed = float(analysis["bytes accessed"])
    except Exception:  # noqa: BLE001 - not every backend implements it
        accessed = None
    try:
        text = compiled.as_text()
        copies, staged, own, hbm = entry_copies(text), entry_staging(text), own_traffic(text), hbm_traffic(text)
    except Exception:  # noqa: BLE001
        copies = staged = own = hbm = None
    return {
        "bytes_accessed": accessed,
        "copies": None if copies is None else len(copies),
        "copy_bytes": None if copies is None else sum(copies),
        "staging_bytes": None if staged is None else sum(staged),
        "own_bytes": None if own is None else sum(own.values()),
        "hbm_bytes": hbm,
    }
