"""A run in flight survives an upgrade of this project: checkpoints written by an earlier main resume and go on.

``tests/data/checkpoints_<commit>/`` holds the step-20 checkpoints of three tiny runs (MARS-AdamW approx and exact,
MARS-M approx) written by main at that commit, and the losses those runs went on to log after step 20:

* 949b23f, before the global clip was folded into the MARS transformations (issue 14): the stored previous gradient
  is the clipped one, or the previous parameters;
* f18f19f, the last main whose ``mars()``/``mars_m()`` kept an ``optax.identity()`` slot at the head of their chain;
* bb2aef0, the last main whose non-finite guard state had no count of the output values it keeps out.

The first two store the MARS state at chain position 1, where today's chain has it at 0, and all three store the
guard's state without its count: resumed by today's code, each run is migrated on load (``training/checkpointing/migrations.py``) and must log the old run's losses. Only float rounding
differs (1.4e-7 of the loss at worst when this test was written; the loss falls by about 3% a step here, so a state
loaded wrongly, such as moments restarted from zero, shows at once).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.training import describe_failure, losses, run_paths, run_python, start_cli, tiny_config

DATA = Path(__file__).parent / "data"
OLD_MAINS = ("949b23f", "f18f19f", "bb2aef0")
RESUMED_STEP = 20
MODES = {
    "approx": {},
    "exact": {"optimizer": {"exact": True}},
    "mars-m": {"optimizer": {"type": "mars-m", "learning_rate": 1e-2, "warmup": 0.1, "min_lr_ratio": 0.1}},
}
RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory, pydocs_corpus):
    """Every old main's three runs resumed by today's code. One old main's three modes start together (three
    programs compile side by side), then the next old main's, whose programs are the same: compiled once, loaded
    from the compilation cache the second time.

    Returns ``{(old_main, mode): (returncode, output, paths)}``.
    """
    workdir = tmp_path_factory.mktemp("upgrade")
    runs = {(old, mode): f"compat-{old}-{mode}" for old in OLD_MAINS for mode in MODES}
    configs = {key: tiny_config(workdir, pydocs_corpus, run_id, MODES[key[1]]) for key, run_id in runs.items()}
    # The runs share the token caches: built first, as a user would before parallel runs, so none reads them half-built.
    pretokenize = run_python("scripts/pretokenize.py", "--config_path", str(next(iter(configs.values()))))
    assert pretokenize.returncode == 0, describe_failure(pretokenize)
    results = {}
    for old in OLD_MAINS:
        started = {}
        for mode in MODES:
            run_id = runs[old, mode]
            paths = run_paths(workdir, run_id)
            shutil.copytree(DATA / f"checkpoints_{old}" / mode / f"step-{RESUMED_STEP}",
                            paths["checkpoints"] / f"step-{RESUMED_STEP}")
            log = workdir / f"{run_id}.log"
            started[old, mode] = (start_cli(configs[old, mode], log_path=log), log, paths)
        for key, (proc, log, paths) in started.items():
            returncode = proc.wait(timeout=1200)
            results[key] = (returncode, log.read_text(), paths)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("old_main", OLD_MAINS)
def test_checkpoint_of_an_earlier_main_resumes_where_it_left_off(resumed_runs, old_main, mode):
    returncode, log, paths = resumed_runs[old_main, mode]
    assert returncode == 0, log[-6000:]
    assert f"step-{RESUMED_STEP}" in log and "Resuming from" in log, log[-3000:]
    assert "migrated on load" in log, log[-3000:]
    stored = json.loads((DATA / f"checkpoints_{old_main}" / "losses_after_step_20.json").read_text())[mode]
    expected = {int(step): loss for step, loss in stored.items()}
    got = losses(paths["metrics"])
    assert min(got) == RESUMED_STEP + 1, sorted(got)
    assert sorted(got) == sorted(expected)
    worst = max(abs(got[step] - loss) / abs(loss) for step, loss in expected.items())
    assert worst < RELATIVE_TOLERANCE, {step: (got[step], expected[step]) for step in expected}
