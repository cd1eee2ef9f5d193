"""Reads every array of a Levanter checkpoint directly with tensorstore (independently of the training code)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorstore as ts


def checkpoint_arrays(checkpoint_dir: Path) -> dict[str, np.ndarray]:
    arrays = {}
    for zarray in sorted(Path(checkpoint_dir).rglob(".zarray")):
        leaf = zarray.parent
        store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(leaf)}}).result()
        arrays[str(leaf.relative_to(checkpoint_dir))] = store.read().result()
    return arrays
