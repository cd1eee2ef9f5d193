"""Fault scenarios derived from the session's uninterrupted runs instead of trained again.

A run killed right after its step-N checkpoint leaves exactly what the uninterrupted run had on disk at that moment:
the checkpoints up to step N and the metrics logged so far. :func:`copy_of_run` rebuilds that state from a finished run
(tests/conftest.py: ``reference_runs``, ``pod_reference``) in a new directory, so a test can damage it and check the
rerun without training the first half again. Scenarios whose *kill itself* is what is tested (a kill mid-write, a
survivor ending after its peer's death) still kill a live run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from tests.helpers.training import run_paths


def copy_of_run(
    config_path: Path, paths: dict, workdir: Path, *, up_to_step: int, run_id: Optional[str] = None,
    metrics_up_to: Optional[int] = None,
) -> tuple[Path, dict]:
    """The run of ``config_path`` as it was right after its step-``up_to_step`` checkpoint, as run ``run_id`` (default:
    the same id) in ``workdir``: its config (pointing into ``workdir``), its checkpoints up to that step and its
    metrics up to step ``metrics_up_to`` (default ``up_to_step``; a resume trims what comes after the checkpoint).

    Returns ``(config_path, paths)`` of the copy."""
    old_id = paths["run_dir"].name
    run_id = run_id or old_id
    # Text replacement keeps the config's own tags (an eval suite's !include) as they are.
    text = config_path.read_text()
    for old, where in ((paths["run_dir"].parent, "runs"), (paths["checkpoints"].parent, "checkpoints")):
        assert str(old) in text, (old, text)
        text = text.replace(str(old), str(workdir / where))
    text = text.replace(f"id: {old_id}\n", f"id: {run_id}\n")
    assert f"id: {run_id}\n" in text, text
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / f"{run_id}.yaml"
    copy.write_text(text)
    new = run_paths(workdir, run_id)
    steps = [p for p in paths["checkpoints"].glob("step-*") if int(p.name.split("-")[1]) <= up_to_step]
    assert any(p.name == f"step-{up_to_step}" for p in steps), (up_to_step, sorted(paths["checkpoints"].iterdir()))
    for step_dir in steps:
        shutil.copytree(step_dir, new["checkpoints"] / step_dir.name)
    new["run_dir"].mkdir(parents=True)
    last = up_to_step if metrics_up_to is None else metrics_up_to
    lines = [line for line in paths["metrics"].read_text().splitlines() if json.loads(line)["step"] <= last]
    new["metrics"].write_text("".join(f"{line}\n" for line in lines))
    return copy, new
