"""Running training with an eval suite and the standalone eval CLI, for end-to-end tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Optional

from tests.helpers import zygote
from tests.helpers.processes import EIGHT_DEVICES  # noqa: F401 - where the e2e tests import it from
from tests.helpers.training import REPO, _env

OFFLINE_SUITE = REPO / "config" / "eval" / "pydocs_offline.yaml"
LOCAL_TASKS = REPO / "tests" / "data" / "lm_eval_tasks"


def include_suite(config_path: Path, suite: Path = OFFLINE_SUITE) -> Path:
    """Adds ``eval_harness: !include <suite>`` to a training YAML, as a user would write it."""
    with config_path.open("a") as f:
        f.write(f"eval_harness: !include {suite}\n")
    return config_path


def run_eval_cli(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m levanter_mars.main.eval_harness ARGS`` from the repository root."""
    return zygote.run(["-m", "levanter_mars.main.eval_harness", *args], cwd=REPO, env=_env(env), timeout=timeout)


def item_loglikelihoods(results_json: Path, task: str = "pydocs_mc") -> list[list[float]]:
    """Each item's log-likelihood of each choice, from a results.json written with log_samples."""
    samples = json.loads(Path(results_json).read_text())["samples"][task]
    return [[float(choice[0]) for choice in sample["filtered_resps"]] for sample in sorted(samples, key=_doc_id)]


def _doc_id(sample: dict) -> int:
    return sample["doc_id"]
