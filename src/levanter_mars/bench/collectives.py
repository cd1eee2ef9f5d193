"""Which devices each collective of a compiled program joins, read from its HLO: the proof that a multi-slice step
crosses the data-center network (DCN) only where the mesh puts a DCN axis.

XLA writes a collective's ``replica_groups`` in three forms: the explicit ``{{0,2},{1,3}}``; the iota
``[2,2]<=[2,2]T(1,0)`` (an ``arange`` reshaped, transposed, then cut into groups); and, from XLA 2026, the mesh form
``mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_0'}`` (the device ids laid out on named axes, a group
for every index of the axes not named). The ids are places in the program's device assignment: for a program
partitioned over a ``jax.sharding.Mesh``, the mesh's devices in order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
_LINE = re.compile(r"%?[\w.\-]+\s*=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_IOTA = re.compile(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}")
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4,
                  "f64": 8, "s64": 8, "u64": 8}  # fmt: skip


@dataclass(frozen=True)
class Collective:
    op: str
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    """The result's size on one device (a tuple's elements summed)."""


def _iota(spec: str) -> np.ndarray:
    """``[a,b]<=[d..]T(p..)``: arange(prod d) reshaped to d, transposed by p, reshaped to [a,b]; ``[d..]T(p..)`` (the
    mesh form's ids): the same, flat."""
    shape, dims, perm = _IOTA.fullmatch(spec.strip()).groups()
    shape = [int(x) for x in shape.split(",")]
    laid_out = [int(x) for x in dims.split(",")] if dims else shape
    ids = np.arange(int(np.prod(laid_out))).reshape(laid_out)
    if perm:
        ids = ids.transpose([int(x) for x in perm.split(",")])
    return ids.reshape(shape) if dims else ids.reshape(-1)


def _as_groups(rows) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(i) for i in row) for row in rows)


def _mesh_groups(match: re.Match) -> tuple[tuple[int, ...], ...]:
    """The mesh form: the ids laid out on the named axes; a group runs along the axes named, for each index of the
    others."""
    axes = [item.split("=") for item in match.group(1).split(",") if item.strip()]
    names, sizes = [name.strip().strip("'") for name, _ in axes], [int(size) for _, size in axes]
    ids = _iota(match.group(2)) if match.group(2) else np.arange(int(np.prod(sizes)))
    over = [names.index(name.strip().strip("'")) for name in match.group(3).split(",") if name.strip()]
    moved = np.moveaxis(ids.reshape(sizes), sorted(over), range(-len(over), 0))
    return _as_groups(moved.reshape(-1, int(np.prod([sizes[i] for i in over]))))


def parse_groups(line: str) -> tuple[tuple[int, ...], ...]:
    """The replica groups of one collective's HLO line (``()``: every device, one group)."""
    mesh = _MESH.search(line)
    if mesh:
        return _mesh_groups(mesh)
    explicit = re.search(r"replica_groups=\{(\{[\d,{} ]*\})\}", line)
    if explicit:
        rows = re.findall(r"\{([\d, ]*)\}", explicit.group(1))
        return _as_groups([i for i in row.split(",") if i.strip()] for row in rows)
    iota = re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)", line)
    if iota:
        return _as_groups(_iota(iota.group(1)))
    pairs = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*)\}", line)
    if pairs:  # a collective-permute: each pair a group
        return _as_groups(p.split(",") for p in re.findall(r"\{(\d+,\d+)\}", pairs.group(0)))
    return ()


def _result_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        total += _ELEMENT_BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of the (optimized) HLO text, in order."""
    found = []
    for line in hlo_text.splitlines():
        match = _LINE.search(line)
        if match and "-done(" not in line:
            found.append(Collective(match.group(2), parse_groups(line), _result_bytes(match.group(1))))
    return found


def crossing(found: Sequence[Collective], slice_of: Sequence[int]) -> list[Collective]:
    """The collectives with a group that spans slices (``slice_of[i]``: the slice of the device at place ``i``)."""
    every = tuple(range(len(slice_of)))
    return [c for c in found if any(len({slice_of[i] for i in g}) > 1 for g in (c.groups or (every,)))]


def only_over_dcn(collective: Collective, slice_of: Sequence[int]) -> bool:
    """Whether each group of ``collective`` holds one device of every slice, all at the same place within its slice:
    a reduction over the DCN axis alone, nothing of an ICI axis mixed in."""
    slices = sorted(set(slice_of))
    place = {}
    for i, s in enumerate(slice_of):
        place[i] = sum(1 for j in range(i) if slice_of[j] == s)
    for group in collective.groups or (tuple(range(len(slice_of))),):
        if sorted(slice_of[i] for i in group) != slices or len({place[i] for i in group}) != 1:
            return False
    return True


@dataclass(frozen=True)
class DcnTransfer:
    kind: str
    """``ALL_REDUCE``, ``ALL_GATHER``, ...: the collective it carries across slices."""
    bytes: int
    reduction: str


_SEND = re.compile(r"%?[\w.\-]+\s*=\s*\((.+?), u32\[\], token\[\]\)\s+send\(")


def dcn_transfers(hlo_text: str) -> list[DcnTransfer]:
    """XLA:TPU's cross-slice traffic in a multi-slice program: each slice's program holds only its own chips'
    collectives (groups of its chips), and what crosses slices is a ``send`` to the MegaScale runtime (its
    ``_xla_megascale_transfer_type``), one per transfer."""
    found = []
    for line in hlo_text.splitlines():
        match = _SEND.search(line)
        kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', line)
        if match and kind:
            reduction = re.search(r'_xla_megascale_reduce_operation="(\w+)"', line)
            found.append(DcnTransfer(kind.group(1), _result_bytes(match.group(1)),
                                     reduction.group(1) if reduction else ""))  # fmt: skip
    return found
