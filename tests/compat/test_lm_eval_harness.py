"""Defects of the pinned Levanter's eval harness, lm-eval and datasets that
``levanter_mars.compat.lm_eval_harness`` works around."""

import inspect
import types

import haliax as hax
import pytest

from levanter_mars.compat import lm_eval_harness
from tests.helpers.compat import LOCAL_TASK
from tests.helpers.pod import run_helper_processes
from tests.helpers.processes import REPO


@pytest.mark.slow  # indexes lm-eval's ~14,000 built-in tasks
def test_defect_11_levanter_cannot_load_a_local_task_yaml(monkeypatch):
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO)  # the task's data_files are relative to the working directory
    assert "tasks.TaskManager()" in inspect.getsource(LmEvalHarnessConfig.to_task_dict)
    with pytest.raises(ValueError, match="Failed to load task"):
        LmEvalHarnessConfig(task_spec=[str(LOCAL_TASK)]).to_task_dict()


def test_defect_11_workaround_indexes_local_task_directories(monkeypatch):
    import lm_eval.tasks
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO)
    original = lm_eval.tasks.TaskManager
    with lm_eval_harness.lm_eval_task_manager([str(LOCAL_TASK.parent)], include_defaults=False):
        tasks = LmEvalHarnessConfig(task_spec=["pydocs_mc"]).to_task_dict()
    assert list(tasks) == ["pydocs_mc"]
    assert len(tasks["pydocs_mc"].test_docs()) == 48
    assert lm_eval.tasks.TaskManager is original


def test_defect_12_final_hooks_are_forced_twice_and_the_harness_hook_logs_without_a_step():
    import levanter.eval_harness
    import levanter.main.train_lm as train_lm
    from levanter.trainer import Trainer

    assert "self.run_hooks(info, force=True)" in inspect.getsource(Trainer.train)
    main_source = inspect.getsource(train_lm.main)
    assert "trainer.train(state, train_loader)" in main_source
    assert "trainer.run_hooks(last_info, force=True)" in main_source
    # The upstream hook itself has no memory of the steps it evaluated, and logs its results with step=None.
    hook_source = inspect.getsource(levanter.eval_harness.lm_eval_harness)
    assert "if step.step == 0 and not force" in hook_source and "_evaluated" not in hook_source
    assert "step=None" in inspect.getsource(levanter.eval_harness.log_report_to_tracker)


def test_defect_12_workaround_evaluates_each_step_once(monkeypatch, tmp_path):
    import levanter.eval_harness

    from levanter_mars.eval.in_training import EvalHarnessHook, results_dir
    from levanter_mars.eval.suite import EvalSuiteConfig

    monkeypatch.chdir(REPO)
    calls = []

    def evaluate(config, model, tasks, *args):
        calls.append(model)
        return {"results": {"pydocs_mc": {"acc,none": 0.5}}, "n-samples": {"pydocs_mc": {"effective": 48}}}

    monkeypatch.setattr(levanter.eval_harness, "_actually_run_eval_harness", evaluate)

    class Info:
        def __init__(self, step):
            self.step, self.eval_model = step, f"model@{step}"

    hook = EvalHarnessHook(
        EvalSuiteConfig(task_spec=[str(LOCAL_TASK)]), None, None, {}, None, run_dir=str(tmp_path), run_name="r"
    )
    from levanter.tracker import NoopTracker, current_tracker

    with current_tracker(NoopTracker()):
        for step, force in [(0, False), (10, False), (19, False), (19, True), (19, True)]:
            hook.on_step(Info(step), force=force)
    assert calls == ["model@10", "model@19"]
    assert (tmp_path / "eval" / "in_training" / "step-19" / "results.md").exists()
    assert results_dir(str(tmp_path), 10).endswith("eval/in_training/step-10")


@pytest.mark.multidevice
def test_defect_13_eval_harness_fails_on_a_multi_device_mesh_and_the_workaround_places_the_batch():
    (result,) = run_helper_processes("tests.helpers.multidevice_eval_dispatch", devices=2, timeout=600)
    assert "incompatible devices" in result["without"], result
    assert result["with"]["finite"] and result["with"]["segments"].count(0) == 2, result


@pytest.mark.multidevice
def test_defect_22_eval_broadcasts_fail_across_processes_under_set_mesh_and_the_workaround_delivers_them():
    for result in run_helper_processes("tests.helpers.multiprocess_broadcast", num_processes=2, devices=2):
        assert "fully addressable" in result["without"], result
        assert result["with"] == "7", result


def test_defect_27_a_task_that_fails_to_load_is_not_named_and_the_workaround_names_it(monkeypatch):
    import lm_eval.tasks
    from levanter.eval_harness import LmEvalHarnessConfig

    def failing_load(task_list, manager):
        task_list[0].pop("task")  # as lm-eval does with a dict entry, before its dataset fails to load
        raise FileNotFoundError("data file missing")

    monkeypatch.setattr(lm_eval.tasks, "get_task_dict", failing_load)
    with pytest.raises(FileNotFoundError) as upstream_error:
        LmEvalHarnessConfig(task_spec=[])._get_task_and_rename(None, "my_alias", {"task": "broken_mc"})
    assert "my_alias" not in str(upstream_error.value)
    with pytest.raises(ValueError, match="Failed to load task my_alias") as ours:
        lm_eval_harness.TaskErrorsNamed(task_spec=[])._get_task_and_rename(None, "my_alias", {"task": "broken_mc"})
    assert isinstance(ours.value.__cause__, FileNotFoundError)


def test_defect_16_datasets_reports_each_packaged_builder_load_to_s3(monkeypatch, tmp_path):
    import datasets.config
    import datasets.load

    heads = []

    class _Session:
        def head(self, url, **kwargs):
            heads.append(url)

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as outside the tests (conftest sets it)
    monkeypatch.setattr(datasets.load, "get_session", _Session)
    datasets.load.PackagedDatasetModuleFactory("json", data_files=str(tmp_path / "x.jsonl"))
    assert heads and "s3.amazonaws.com" in heads[0], heads
    heads.clear()
    with lm_eval_harness.no_datasets_download_counts():
        datasets.load.PackagedDatasetModuleFactory("json", data_files=str(tmp_path / "x.jsonl"))
    assert heads == []


def test_defect_30_levanter_logs_the_traceback_of_a_task_that_fails_to_load(caplog):
    """The reason for levanter_mars.compat.lm_eval_harness.task_load_failures_unlogged (the workaround is shown
    by tests/test_eval_suites.py::test_an_unknown_task_is_one_line_naming_it_and_its_near_names): Levanter logs the
    whole traceback, then raises the same failure."""
    from levanter.eval_harness import LmEvalHarnessConfig

    with pytest.raises(ValueError, match="Failed to load task no_such_task"):
        LmEvalHarnessConfig(task_spec=["no_such_task"]).to_task_dict()
    logged = [r for r in caplog.records if r.name == "levanter.eval_harness" and r.exc_info]
    assert logged and logged[0].getMessage() == "Failed to load task no_such_task"


class _Worker:
    """Stands in for Levanter's harness worker: records whether process 0 released the others (STOP)."""

    stops: list = []

    def __init__(self, *args, **kwargs):
        self.sample_logging_config = self.profiler_config = None

    def make_harness_lm(self):
        return types.SimpleNamespace(leader=self, clear_sample_outputs=lambda: None)

    def stop(self):
        _Worker.stops.append(True)


def test_defect_39_a_failure_in_lm_eval_never_releases_the_harness_workers_and_the_workaround_does(monkeypatch):
    import levanter.eval_harness as harness

    def failing_evaluate(lm, *args, **kwargs):
        raise ValueError("a task failed while scoring")

    monkeypatch.setattr(harness, "_LmEvalHarnessWorker", _Worker)
    monkeypatch.setattr(harness.evaluator, "evaluate", failing_evaluate)
    model = types.SimpleNamespace(Pos=hax.Axis("position", 8))
    run = lambda: harness._actually_run_eval_harness(  # noqa: E731
        harness.LmEvalHarnessConfig(task_spec=[]), model, {}, None, hax.Axis("batch", 2), {}, None
    )
    _Worker.stops.clear()
    with pytest.raises(ValueError, match="while scoring"):
        run()
    assert _Worker.stops == [], "the other processes would wait for requests forever"
    with pytest.raises(ValueError, match="while scoring"), lm_eval_harness.workers_released_on_failure():
        run()
    assert _Worker.stops == [True]


def test_defect_39_lm_eval_does_not_name_the_task_that_failed_and_the_workaround_finds_it(monkeypatch):
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO)
    with lm_eval_harness.lm_eval_task_manager([str(LOCAL_TASK.parent)], include_defaults=False):
        task = LmEvalHarnessConfig(task_spec=["pydocs_mc"]).to_task_dict()["pydocs_mc"]
    doc = task.test_docs()[0]
    with pytest.raises(Exception) as error:  # scoring with results of the wrong shape fails inside the task
        task.process_results(doc, [None])
    assert "pydocs_mc" not in str(error.value)
    assert lm_eval_harness.failing_task(error.value) == "pydocs_mc"
    assert lm_eval_harness.failing_task(ValueError("the model failed")) is None
