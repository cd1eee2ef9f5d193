"""Eval suites: the shipped suites are the paper's real lm-eval tasks, local tasks load offline by path or name,
a training YAML includes a suite relative to itself, and missing data is reported with how to get it."""

import shutil

import pytest

from levanter_mars.eval.report import TableColumn
from levanter_mars.eval.suite import EvalDatasetError, EvalSuiteConfig, TaskSpecError, resolve_task_spec
from levanter_mars.program_config import parse_train_config
from levanter_mars.training.config import parse_config
from tests.helpers.evals import LOCAL_TASKS, OFFLINE_SUITE
from tests.helpers.training import REPO, TINY_CONFIG

EVAL_CONFIGS = REPO / "config" / "eval"
LOCAL_TASK = LOCAL_TASKS / "pydocs_mc.yaml"
PAPER_COLUMNS = ["ARC-E", "ARC-C", "BoolQ", "HellaSwag", "OBQA", "PIQA", "WG", "MMLU", "SciQ"]
PAPER_TASKS = ["arc_easy", "arc_challenge", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande", "mmlu", "sciq"]


def _suite(path) -> EvalSuiteConfig:
    return parse_config(["--config_path", str(path)], EvalSuiteConfig)


@pytest.fixture(scope="module")
def builtin_task_index():
    """lm-eval's index of its built-in tasks (5 s to build: once per module)."""
    import lm_eval.tasks

    return lm_eval.tasks.TaskManager().task_index


@pytest.fixture
def reuse_builtin_index(monkeypatch, builtin_task_index):
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks.TaskManager, "initialize_tasks", lambda self, **kw: builtin_task_index)


def test_paper_suite_is_the_nine_tasks_zero_shot_in_the_papers_layout():
    suite = _suite(EVAL_CONFIGS / "paper.yaml")
    assert [entry.task for entry in suite.task_spec] == PAPER_TASKS
    assert all(entry.num_fewshot == 0 for entry in suite.task_spec)
    assert suite.max_examples is None
    assert [c.label for c in suite.columns] == PAPER_COLUMNS
    assert [c.task for c in suite.columns] == PAPER_TASKS
    acc_only = {"boolq", "winogrande", "mmlu"}
    assert all(c.metric == ("acc" if c.task in acc_only else "acc_norm") for c in suite.columns)


@pytest.mark.parametrize("name", ["paper", "quick"])
def test_suite_tasks_are_real_lm_eval_tasks_reporting_the_table_metric(name, builtin_task_index):
    from lm_eval.utils import load_yaml_config

    suite = _suite(EVAL_CONFIGS / f"{name}.yaml")
    assert {c.task for c in suite.columns} == {entry.task for entry in suite.task_spec}
    for column in suite.columns:
        entry = builtin_task_index[column.task]
        config = load_yaml_config(entry["yaml_path"], mode="full")
        if entry["type"] == "group":  # mmlu: the size-weighted mean of its subtasks
            reported = [m["metric"] for m in config["aggregate_metric_list"]]
        else:
            assert "/" in config["dataset_path"], config["dataset_path"]  # a Hugging Face Hub dataset
            reported = [m["metric"] for m in config["metric_list"]]
        assert column.metric in reported, (column, reported)
    if name == "quick":
        paper = {c.task: c for c in _suite(EVAL_CONFIGS / "paper.yaml").columns}
        assert all(paper[c.task] == c for c in suite.columns) and suite.max_examples


def test_a_real_suite_without_its_datasets_says_how_to_get_them(reuse_builtin_index):
    with pytest.raises(EvalDatasetError) as error:
        _suite(EVAL_CONFIGS / "quick.yaml").to_task_dict()  # offline in tests: nothing is cached
    message = str(error.value)
    for expected in ("arc_easy", "allenai/ai2_arc", "--download_only true", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE"):
        assert expected in message, message
    # The tests run with HF_HUB_OFFLINE=1 (conftest): the message says that is why, not to set it to 0 blindly.
    assert "HF_HUB_OFFLINE is set here" in message or "HF_DATASETS_OFFLINE and HF_HUB_OFFLINE are set here" in message


def test_the_offline_suite_loads_its_local_task_by_path(monkeypatch):
    monkeypatch.chdir(REPO)
    tasks = _suite(OFFLINE_SUITE).to_task_dict()
    assert list(tasks) == ["pydocs_mc"]
    docs = tasks["pydocs_mc"].test_docs()
    assert len(docs) == 48 and all(len(doc["choices"]) == 4 for doc in docs)
    # The answers are spread over the four positions, so always picking one position scores 25%.
    assert sorted({doc["answer"] for doc in docs}) == [0, 1, 2, 3]


def test_the_offline_suite_sends_no_download_count_to_the_hub(monkeypatch):
    # Outside the tests HF_HUB_OFFLINE is usually unset; `datasets` then reports every load of its `json` builder
    # with a HEAD request to s3.amazonaws.com (and swallows the error), so the offline suite reached the network.
    import datasets
    import datasets.load

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    requests = []

    class RecordingSession:
        def head(self, url, **kwargs):
            requests.append(url)
            raise ConnectionError("no network in tests")

    monkeypatch.setattr(datasets.load, "get_session", lambda: RecordingSession())
    tasks = _suite(OFFLINE_SUITE).to_task_dict()
    assert list(tasks) == ["pydocs_mc"]
    assert requests == []
    assert datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True  # restored afterwards


def test_a_local_task_by_name_loads_without_indexing_lm_evals_builtins(monkeypatch):
    import lm_eval.tasks

    monkeypatch.chdir(REPO)
    calls = []
    original = lm_eval.tasks.TaskManager.initialize_tasks

    def recording(self, include_path=None, include_defaults=True):
        calls.append((include_path, include_defaults))
        return original(self, include_path=include_path, include_defaults=include_defaults)

    monkeypatch.setattr(lm_eval.tasks.TaskManager, "initialize_tasks", recording)
    tasks = EvalSuiteConfig(task_spec=["pydocs_mc"], include_path=[str(LOCAL_TASKS)]).to_task_dict()
    assert list(tasks) == ["pydocs_mc"]
    assert calls == [([str(LOCAL_TASKS)], False)]


def test_task_yaml_paths_resolve_to_their_names_and_directories(tmp_path):
    spec, directories = resolve_task_spec([str(LOCAL_TASK), {"task": str(LOCAL_TASK), "num_fewshot": 0}, "hellaswag"])
    assert spec == ["pydocs_mc", {"task": "pydocs_mc", "num_fewshot": 0}, "hellaswag"]
    assert directories == [str(LOCAL_TASKS)]
    with pytest.raises(TaskSpecError, match="no such task YAML"):
        resolve_task_spec([str(tmp_path / "missing.yaml")])
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("dataset_path: json\ndoc_to_text: !function utils.doc_to_text\n")
    with pytest.raises(TaskSpecError, match="defines no task name"):
        resolve_task_spec([str(nameless)])


def test_a_missing_local_data_file_is_reported_with_the_path_rule(tmp_path):
    task = tmp_path / "broken.yaml"
    task.write_text(LOCAL_TASK.read_text().replace("task: pydocs_mc", "task: broken_mc").replace(
        "tests/data/lm_eval_tasks/pydocs_mc.jsonl", "no/such/file.jsonl"))
    with pytest.raises(EvalDatasetError, match="broken_mc.*relative to the working directory"):
        EvalSuiteConfig(task_spec=[str(task)]).to_task_dict()


def test_a_training_yaml_includes_a_suite_relative_to_itself(tmp_path):
    (tmp_path / "eval").mkdir()
    shutil.copy(EVAL_CONFIGS / "quick.yaml", tmp_path / "eval" / "quick.yaml")
    train_yaml = tmp_path / "train.yaml"
    train_yaml.write_text(TINY_CONFIG.read_text() + "eval_harness: !include eval/quick.yaml\neval_harness_steps: 500\n")
    config = parse_train_config(["--config_path", str(train_yaml)])
    assert isinstance(config.eval_harness, EvalSuiteConfig)
    assert config.eval_harness == _suite(EVAL_CONFIGS / "quick.yaml")
    assert config.eval_harness_steps == 500
    assert config.eval_harness.columns[1] == TableColumn("hellaswag", "HellaSwag", "acc_norm")
    # On the command line, draccus' `include` keyword takes a path relative to the working directory.
    from_cli = parse_train_config(["--config_path", str(TINY_CONFIG), "--eval_harness", f"include {OFFLINE_SUITE}"])
    assert from_cli.eval_harness == _suite(OFFLINE_SUITE)


def test_standalone_cli_reports_bad_input_naming_the_field_or_file(tmp_path, capsys):
    import json

    from levanter_mars.main.eval_harness import cli

    suite = ["--config_path", str(OFFLINE_SUITE)]
    assert cli(["--config_path", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    # A path that holds no checkpoint is a typo in the command (exit 2, naming the field and the path), not unusable
    # checkpoint storage (exit 5, which a launcher would retry).
    nowhere = tmp_path / "nowhere"
    assert cli([*suite, "--checkpoint_path", str(nowhere)]) == 2
    assert f"config error: checkpoint_path: no such directory '{nowhere}'" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli([*suite, "--checkpoint_path", str(tmp_path / "empty")]) == 2
    assert f"checkpoint_path '{tmp_path / 'empty'}' holds no checkpoint" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert cli([*suite, "--checkpoint_path", str(tmp_path / "a-file")]) == 2
    assert "is a file, not a checkpoint directory" in capsys.readouterr().err
    assert cli([*suite, "--checkpoint_path", str(tmp_path / "empty"), "--checkpoint_is_hf", "true"]) == 2
    assert "is not an HF checkpoint (checkpoint_is_hf): it has no config.json" in capsys.readouterr().err
    assert cli(suite) == 2
    assert "checkpoint_path: give a checkpoint, or train_config_path" in capsys.readouterr().err

    step = tmp_path / "run" / "step-3"
    step.mkdir(parents=True)
    (step / "metadata.json").write_text(json.dumps({"step": 3, "timestamp": "2026-01-01T00:00:00"}))
    assert cli([*suite, "--checkpoint_path", str(step)]) == 2  # arrays only: the model config is unknown
    assert "train_config_path" in capsys.readouterr().err
    (step / "levanter_mars_manifest.json").write_text(json.dumps({"files": {"model/x": {"size": 1, "crc32c": "0"}}}))
    assert cli([*suite, "--checkpoint_path", str(step.parent)]) == 5
    error = capsys.readouterr().err
    assert "holds no complete checkpoint" in error and "corrupt (missing file model/x)" in error, error
    assert cli([*suite, "--checkpoint_path", str(step), "--train_config_path", str(TINY_CONFIG)]) == 5
    assert "corrupt (missing file model/x)" in capsys.readouterr().err


def test_a_checkpoint_path_that_holds_nothing_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch):
    """Issue 46: a typo in --checkpoint_path was exit 5 (checkpoint storage unusable). It is a config error, found
    before the tokenizer, the device mesh or a compile; storage that cannot be read stays exit 5."""
    import fsspec.implementations.local

    from levanter_mars.eval import standalone
    from levanter_mars.main.eval_harness import cli

    def nothing_may_load(*args, **kwargs):
        raise AssertionError("loaded the tokenizer for a checkpoint path that holds nothing")

    monkeypatch.setattr(standalone, "load_tokenizer", nothing_may_load)
    monkeypatch.chdir(tmp_path)
    run = ["--config_path", str(OFFLINE_SUITE), "--train_config_path", str(TINY_CONFIG)]
    assert cli([*run, "--checkpoint_path", "checkpionts/nano/step-3"]) == 2
    assert "checkpoint_path: no such directory 'checkpionts/nano/step-3'" in capsys.readouterr().err
    assert cli(run) == 2  # no checkpoint_path: the YAML's run, which has none here
    error = capsys.readouterr().err
    assert "checkpoint_path (not given: the run checkpoint directory of train_config_path): no such directory" in error

    def unreadable(self, path, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "info", unreadable)
    assert cli([*run, "--checkpoint_path", str(tmp_path)]) == 5
    assert f"checkpoint_path '{tmp_path}' cannot be read: PermissionError" in capsys.readouterr().err


def test_standalone_results_of_another_runs_checkpoint_go_to_that_run(tmp_path, monkeypatch):
    # Two runs of one YAML (the second trained with --trainer.id other): evaluating the second's checkpoint with the
    # YAML must not label it as the first run nor overwrite the first run's results.
    import dataclasses

    from levanter_mars.eval.standalone import (
        CheckpointSource,
        EvalHarnessMainConfig,
        checkpoint_run_id,
        default_output_dir,
    )

    monkeypatch.chdir(tmp_path)
    train = parse_train_config(["--config_path", str(TINY_CONFIG), "--trainer.id", "first",
                          "--trainer.checkpointer.base_path", "ckpts", "--trainer.log_dir", "logs"])
    suite = EvalHarnessMainConfig(task_spec=["pydocs_mc"])
    own = CheckpointSource(str(tmp_path / "ckpts" / "first" / "step-9"), 9, False)  # same run, absolute path
    other = CheckpointSource("ckpts/other/step-9", 9, False)
    elsewhere = CheckpointSource("/somewhere/else/second/step-9", 9, False)
    assert checkpoint_run_id(train, own) == "first"
    assert checkpoint_run_id(train, other) == "other"
    assert checkpoint_run_id(train, elsewhere) == "second"
    assert default_output_dir(suite, train, own, "s") == "logs/first/eval/s/step-9"
    assert default_output_dir(suite, train, other, "s") == "logs/other/eval/s/step-9"
    explicit = dataclasses.replace(suite, output_dir="out")
    assert default_output_dir(explicit, train, other, "s") == "out"


def test_standalone_results_of_a_run_with_another_log_dir_go_next_to_its_checkpoint(tmp_path, monkeypatch):
    """A run trained with another log_dir (and base_path) but the same run id: the YAML's log_dir is another run's
    tree, and the run's own log_dir is unknown: results go next to the checkpoint (issue 25, defect 8)."""
    from levanter_mars.eval.standalone import CheckpointSource, EvalHarnessMainConfig, checkpoint_run_id
    from levanter_mars.eval.standalone import default_output_dir

    monkeypatch.chdir(tmp_path)
    train = parse_train_config(["--config_path", str(TINY_CONFIG), "--trainer.id", "nano-mars",
                          "--trainer.checkpointer.base_path", "ckpts", "--trainer.log_dir", "logs"])
    suite = EvalHarnessMainConfig(task_spec=["pydocs_mc"])
    same_id_elsewhere = CheckpointSource("other/ckpt/nano-mars/step-29", 29, False)
    assert checkpoint_run_id(train, same_id_elsewhere) == "nano-mars"
    assert default_output_dir(suite, train, same_id_elsewhere, "s") == "other/ckpt/nano-mars/eval/s/step-29"
    second = CheckpointSource("/somewhere/else/second/step-9", 9, False)
    assert default_output_dir(suite, train, second, "s") == "/somewhere/else/second/eval/s/step-9"
    # An HF export of run hf-trial (<hf_save_path>/<run id>/step-N) is hf-trial's, not the YAML's run.
    export = CheckpointSource("exports/hf-trial/step-29", None, True)
    assert checkpoint_run_id(train, export) == "hf-trial"
    assert default_output_dir(suite, train, export, "s") == "exports/hf-trial/eval/s/hf-step-29"
    own_export = CheckpointSource("exports/nano-mars/step-29", None, True)
    assert default_output_dir(suite, train, own_export, "s") == "logs/nano-mars/eval/s/hf-step-29"


def test_an_unknown_task_is_one_line_naming_it_and_its_near_names(reuse_builtin_index, capfd):
    """It was 63 lines and 3 tracebacks ending `ValueError: Failed to load task no_such_task`."""
    from levanter_mars.main.eval_harness import cli

    argv = ["--config_path", str(OFFLINE_SUITE), "--download_only", "true", "--task_spec"]
    assert cli([*argv, '["hellaswg"]']) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Failed to load task" not in err, err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("config error: task_spec: unknown task 'hellaswg': not among lm-eval's "), line
    assert "did you mean 'hellaswag'" in line, line
    assert cli([*argv, '["no_such_task"]']) == 2
    assert "unknown task 'no_such_task'" in capfd.readouterr().err

