"""The comparison's pool of runs (``compare.execute``): what it reads of a running run's metrics for its progress line."""

import json

from levanter_mars.compare.execute import Running
from levanter_mars.compare.tuning import RunKey
from levanter_mars.training.run.metrics import read_metrics


def test_a_runs_step_is_read_from_the_records_appended_since_the_last_look(tmp_path):
    path = tmp_path / "metrics.jsonl"
    run = Running(RunKey("a", (), 0), "r", None, None, 0.0, str(path), 10)
    assert run.step() == 0  # no file yet

    def append(text):
        with path.open("a") as f:
            f.write(text)

    def reference():  # the whole file read as the comparison reads a finished run's metrics
        return max((int(r["step"]) + 1 for r in read_metrics(path)), default=0)

    append(json.dumps({"step": 0, "train/loss": 8.0}) + "\n" + json.dumps({"step": 1}) + "\n")
    assert run.step() == reference() == 2
    append('{"step": 2, "train/lo')  # a record being written: not counted until whole
    assert run.step() == 2
    append('ss": 7.0}\n' + json.dumps({"step": 1, "eval/loss": 7.5}) + "\n")  # an eval record of an earlier step
    assert run.step() == reference() == 3
    path.write_text(json.dumps({"step": 0}) + "\n")  # the run set aside and started again: a shorter file
    assert run.step() == reference() == 1
