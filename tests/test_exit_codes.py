"""Exit codes with meaning (training/errors.py): each stop the run decides has its own code, 1 is a crash, and every
launcher (the Ray pod driver and launcher, the plain-gcloud loop) retries crashes only and ends with the run's own
code. The table is the same in errors.py, the README and docs/reliability.md. (The codes of real runs:
tests/test_reliability.py, tests/test_infra_local_ray.py.)"""

import re
from pathlib import Path

import pytest

from levanter_mars.eval.suite import EvalDatasetError, TaskSpecError
from levanter_mars.infra import launch, pod
from levanter_mars.main.train_lm import exit_code
from levanter_mars.training.config import ConfigError
from levanter_mars.training.errors import (
    DECIDED_STOPS,
    CheckpointError,
    CheckpointMismatchError,
    DataExhaustedError,
    EvalFailedError,
    ExitCode,
    LeaseRecordError,
    NonFiniteTrainingError,
    Preempted,
    ResizeRequested,
    RunLeasedError,
    StorageError,
    StoragePathError,
)
from levanter_mars.training.outcome import RetryBudget, judge

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("error,code", [
    (ConfigError("x"), 2), (TaskSpecError("x"), 2), (NonFiniteTrainingError("x"), 3), (DataExhaustedError("x"), 4),
    (CheckpointError("x"), 5), (EvalFailedError("x"), 6), (EvalDatasetError("x"), 6), (RuntimeError("bug"), 1),
    (OSError("lost a peer"), 1), (ResizeRequested("x"), 7), (StoragePathError("x"), 2),
    (CheckpointMismatchError("another optimizer"), 2), (LeaseRecordError("x"), 2), (StorageError("lease"), 5),
    (RunLeasedError("x"), 8), (Preempted("x"), 9), (KeyboardInterrupt(), 130),
])  # fmt: skip
def test_each_stop_the_run_decides_has_its_own_code_and_anything_else_is_a_crash(error, code):
    assert exit_code(error) == code


def test_launchers_retry_crashes_signals_storage_and_asked_resizes_only():
    """On one host, with budgets left: what is retried (training/outcome.py has the whole policy). A person's
    interrupt, as the program reports it (130) or as a process killed by SIGINT (-2), is not."""
    retried = [c for c in range(-15, 160) if judge([c], RetryBudget(), {}).action == "retry"]
    assert retried == [*range(-15, -2), -1, 1, 5, 7, 9, 128, 129, *range(131, 160)]
    assert judge([7, -15], RetryBudget(), {}).retry_kind == "resize"  # the peer torn down after process 0 stopped
    assert judge([7, 7], RetryBudget(resize=1), {"resize": 1}).action == "give_up"
    # A preemption that saved (every host, or process 0 with a peer torn down after it) is a preemption, not a failure:
    # its budget, never the failures'.
    for exits in ([9, 9], [9, -15], [9, None]):
        assert judge(exits, RetryBudget(failure=0), {}).retry_kind == "preemption", exits
    assert judge([9, 9], RetryBudget(preemption=2), {"preemption": 2}).action == "give_up"
    assert DECIDED_STOPS == {2, 3, 4, 5, 6, 8, 130}


def test_the_pod_driver_and_the_launcher_end_with_the_runs_own_code(capsys):
    def results(*codes):
        return lambda previous: [{"returncode": c, "process": (0, i)} for i, c in enumerate(codes)]

    assert pod.run_attempts(results(0, 0), RetryBudget()) == 0
    assert pod.run_attempts(results(3, 3), RetryBudget()) == 3
    assert "exit 3 (nonfinite stop)" in capsys.readouterr().err
    # A preempted attempt that saved (exit 9 on every host) is retried at once, on the preemption budget.
    attempts = iter([(9, 9), (0, 0)])
    assert pod.run_attempts(lambda previous: results(*next(attempts))(previous), RetryBudget(failure=0)) == 0
    assert "the run was preempted" in capsys.readouterr().err and next(attempts, None) is None
    # The launcher reads the driver's exit code: a run's own stop is passed on, anything else is a failure.
    assert [launch.launch_exit_code(c) for c in (2, 3, 4, 5, 6, 8, 130)] == [2, 3, 4, 5, 6, 8, 130]
    assert [launch.launch_exit_code(c) for c in (None, 1, 9, 137, -9)] == [1, 1, 1, 1, 1]


def _table(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2).strip() for m in re.finditer(r"^\| (\d+) \| ([^|]+?) \|", text, re.M)}


def test_the_table_is_the_same_in_the_code_the_readme_and_the_reliability_doc():
    import levanter_mars.training.errors as errors

    tables = {name: _table(text) for name, text in {
        "errors.py": errors.__doc__, "README.md": (REPO / "README.md").read_text(),
        "docs/reliability.md": (REPO / "docs" / "reliability.md").read_text(),
    }.items()}  # fmt: skip
    assert sorted(tables["errors.py"]) == [int(c) for c in ExitCode], tables["errors.py"]
    for name, table in tables.items():
        assert table == tables["errors.py"], name


def test_the_standalone_evaluations_codes_are_documented_and_linked_from_the_table():
    """Its codes are the training program's (main/eval_harness.py returns 0, 2, 5 and 6; a traceback is 1)."""
    evals = (REPO / "docs" / "evals.md").read_text()
    section = evals[evals.index("### Exit codes") :]
    table = _table(section[: section.index("\n\n", section.index("| code"))])
    assert sorted(table) == [ExitCode.DONE, ExitCode.CRASH, ExitCode.CONFIG_ERROR, ExitCode.CHECKPOINT_STORAGE,
                             ExitCode.EVAL_FAILED]  # fmt: skip
    assert "holds no checkpoint" in table[ExitCode.CONFIG_ERROR]
    assert "(evals.md#exit-codes)" in (REPO / "docs" / "reliability.md").read_text()
