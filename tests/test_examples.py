"""The examples in examples/ run as documented (a few steps each)."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str, monkeypatch):
    """The example as a module (registered: its Equinox modules are dataclasses, which look their module up)."""
    spec = importlib.util.spec_from_file_location(f"examples.{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_equinox_stacked_layers_train_with_mars_through_plain_optax(capsys, monkeypatch):
    example = _load("equinox_stacked_mars", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every tensor is declared: nothing takes a branch silently
        losses = example.train(steps=60)
    assert losses[-1] < 0.1 * losses[0], losses
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith(".")}
    assert listing[".blocks.weight"].split()[1:3] == ["MARS", "matrix"] and " dim0 " in listing[".blocks.weight"]
    assert "(dim2) x (dim1)" in listing[".blocks.weight"]  # rows = out, one [out, in] matrix per layer
    assert listing[".blocks.bias"].split()[1] == "AdamW/1-D" and listing[".embed.bias"].split()[1] == "AdamW/1-D"
