"""A run in flight survives an upgrade of this project: checkpoints written by an earlier main resume and go on.

``tests/data/checkpoints_949b23f/`` holds the step-20 checkpoints of three tiny runs (MARS-AdamW approx and exact,
MARS-M approx) written by main at 949b23f, before the global clip was folded into the MARS transformations (issue 14),
and the losses those runs went on to log after step 20. Resumed by today's code, each run must load the old optimizer
state as it is (same layout, same meaning: the stored previous gradient is the clipped one, or the previous
parameters) and log the old run's losses: only float rounding differs between the two formulations (1.4e-7 of the
loss at worst when this test was written; the loss falls by about 3% a step here, so a state loaded wrongly, such as
moments restarted from zero, shows at once).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.training import REPO, describe_failure, losses, run_paths, start_cli, tiny_config

OLD_MAIN = Path(__file__).parent / "data" / "checkpoints_949b23f"
RESUMED_STEP = 20
MODES = {
    "approx": {},
    "exact": {"optimizer": {"exact": True}},
    "mars-m": {"optimizer": {"type": "mars-m", "learning_rate": 1e-2, "warmup": 0.1, "min_lr_ratio": 0.1}},
}
RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory, pydocs_corpus):
    """The three runs resumed by today's code, started together (their start-up and compilation overlap).

    Returns ``{mode: (returncode, output, paths)}``.
    """
    workdir = tmp_path_factory.mktemp("upgrade")
    configs = {mode: tiny_config(workdir, pydocs_corpus, f"compat-{mode}", overrides) for mode, overrides in MODES.items()}
    # The runs share the token caches: built first, as a user would before parallel runs, so none reads them half-built.
    pretokenize = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pretokenize.py"), "--config_path", str(configs["approx"])],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert pretokenize.returncode == 0, describe_failure(pretokenize)
    started = {}
    for mode, config in configs.items():
        paths = run_paths(workdir, f"compat-{mode}")
        shutil.copytree(OLD_MAIN / mode / f"step-{RESUMED_STEP}", paths["checkpoints"] / f"step-{RESUMED_STEP}")
        log = workdir / f"compat-{mode}.log"
        started[mode] = (start_cli(config, log_path=log), log, paths)
    results = {}
    for mode, (proc, log, paths) in started.items():
        returncode = proc.wait(timeout=900)
        results[mode] = (returncode, log.read_text(), paths)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_checkpoint_of_the_previous_main_resumes_where_it_left_off(resumed_runs, mode):
    returncode, log, paths = resumed_runs[mode]
    assert returncode == 0, log[-6000:]
    assert f"step-{RESUMED_STEP}" in log and "Resuming from" in log, log[-3000:]
    expected = {int(step): loss for step, loss in json.loads((OLD_MAIN / "losses_after_step_20.json").read_text())[mode].items()}
    got = losses(paths["metrics"])
    assert min(got) == RESUMED_STEP + 1, sorted(got)
    assert sorted(got) == sorted(expected)
    worst = max(abs(got[step] - loss) / abs(loss) for step, loss in expected.items())
    assert worst < RELATIVE_TOLERANCE, {step: (got[step], expected[step]) for step in expected}
