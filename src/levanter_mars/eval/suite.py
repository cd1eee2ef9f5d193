"""Eval suites: Levanter's ``LmEvalHarnessConfig`` plus local tasks and the layout of the results table.

A suite is a YAML file (``config/eval/*.yaml``) that is used in two places:

* in a training config, as ``eval_harness: !include eval/quick.yaml`` (run every ``eval_harness_steps`` and at the
  end of training);
* on its own, as ``python -m levanter_mars.main.eval_harness --config_path config/eval/quick.yaml ...``.

A ``task_spec`` entry is an lm-eval task or group name (``hellaswag``, ``mmlu``), the name of a task defined by a
YAML file in one of ``include_path``'s directories, or the path of such a YAML file. Entries may also be Levanter
``TaskConfig`` dicts (``{task: hellaswag, num_fewshot: 10, task_alias: hellaswag_10shot}``), whose ``task`` may
likewise be a path.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import yaml
from levanter.eval_harness import LmEvalHarnessConfig

from levanter_mars.compat import lm_eval_harness
from levanter_mars.eval.report import TableColumn

_YAML_SUFFIXES = (".yaml", ".yml")


class TaskSpecError(ValueError):
    """A ``task_spec`` entry names a YAML file that does not exist or defines no task."""


class EvalDatasetError(RuntimeError):
    """A task's data cannot be loaded; the message names the task and says how to make the data available."""


@dataclass(frozen=True)
class EvalSuiteConfig(lm_eval_harness.TaskErrorsNamed):
    include_path: list[str] = field(default_factory=list)
    """Directories of local lm-eval task YAMLs, whose tasks can then be named in ``task_spec``. Relative paths are
    relative to the working directory, like lm-eval's ``dataset_kwargs.data_files``."""
    columns: list[TableColumn] = field(default_factory=list)
    """The results table: one column per entry, in order, plus their average. Empty: one column per task."""

    def to_task_dict(self) -> dict:
        """Levanter's ``to_task_dict``, with local task YAMLs resolvable (defect 11 in levanter_mars.compat) and a clear
        :class:`EvalDatasetError` when a task's data cannot be loaded."""
        spec, directories = resolve_task_spec(self.to_task_spec())
        directories = _unique([*self.include_path, *directories])
        # Indexing lm-eval's built-in tasks takes 5 s: skipped when every task is defined locally.
        local = local_task_names(directories)
        needs_builtins = any(_task_name(entry) not in local for entry in spec)
        resolved = dataclasses.replace(self, task_spec=spec)
        with (
            lm_eval_harness.lm_eval_task_manager(directories, include_defaults=needs_builtins),
            lm_eval_harness.no_datasets_download_counts(),
        ):
            try:
                with lm_eval_harness.task_load_failures_unlogged():
                    return LmEvalHarnessConfig.to_task_dict(resolved)
            except ValueError as e:
                raise _unknown_task_error(e, directories) or _dataset_error(e) or e


_FAILED_TO_LOAD = lm_eval_harness.FAILED_TO_LOAD


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _task_name(entry: str | dict) -> str:
    return entry if isinstance(entry, str) else entry["task"]


def is_task_yaml_path(task: Any) -> bool:
    return isinstance(task, str) and task.endswith(_YAML_SUFFIXES)


def task_name_of_yaml(path: str) -> str:
    """The ``task:`` name defined by an lm-eval task YAML (a group YAML's ``group:``)."""
    if not os.path.isfile(path):
        raise TaskSpecError(f"task_spec: no such task YAML {path!r} (relative paths are relative to {os.getcwd()})")
    # lm-eval YAMLs may use tags such as !function; only the name is needed here.
    with open(path) as f:
        config = yaml.load(f, Loader=_PermissiveLoader) or {}
    name = config.get("task") if isinstance(config.get("task"), str) else config.get("group")
    if not isinstance(name, str):
        raise TaskSpecError(f"task_spec: {path!r} defines no task name (no `task:` or `group:` string)")
    return name


class _PermissiveLoader(yaml.SafeLoader):
    pass


_PermissiveLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def local_task_names(directories: Iterable[str]) -> set[str]:
    """The task and group names defined by the YAML files under ``directories``."""
    names = set()
    for directory in directories:
        for root, _, files in os.walk(directory):
            for file in files:
                if file.endswith(_YAML_SUFFIXES):
                    try:
                        names.add(task_name_of_yaml(os.path.join(root, file)))
                    except (TaskSpecError, yaml.YAMLError):
                        pass  # templates and other non-task YAMLs
    return names


def resolve_task_spec(entries: list) -> tuple[list, list[str]]:
    """Replaces YAML paths in ``entries`` by the names they define; returns the new entries and their directories."""
    resolved, directories = [], []
    for entry in entries:
        task = _task_name(entry)
        if not is_task_yaml_path(task):
            resolved.append(entry)
            continue
        name = task_name_of_yaml(task)
        directories.append(os.path.dirname(os.path.abspath(task)))
        resolved.append(name if isinstance(entry, str) else {**entry, "task": name})
    return resolved, _unique(directories)


def _causes(error: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _failed_task(chain: list[BaseException], error: BaseException) -> str:
    names = [str(e).removeprefix(_FAILED_TO_LOAD) for e in chain if str(e).startswith(_FAILED_TO_LOAD)]
    return names[-1] if names else str(error)


def _unknown_task_error(error: ValueError, directories: list[str]) -> Optional[TaskSpecError]:
    """lm-eval looks a task name up in its index (a KeyError when absent): say so in one line, with near names.
    Called inside the task manager's context, so the index searched is the one the task was missing from."""
    import difflib

    import lm_eval.tasks

    chain = _causes(error)
    task = _failed_task(chain, error)
    if not any(isinstance(e, KeyError) and e.args == (task,) for e in chain):
        return None
    known = lm_eval.tasks.TaskManager().all_tasks
    near = difflib.get_close_matches(task, known, n=3, cutoff=0.8)
    where = f"lm-eval's {len(known)} tasks and groups"
    where += f" and the task YAMLs in {directories}" if directories else ""
    hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
    return TaskSpecError(f"task_spec: unknown task {task!r}: not among {where}{hint}")


def _dataset_error(error: ValueError) -> Optional[EvalDatasetError]:
    """Levanter reports every task-loading failure as ``ValueError("Failed to load task ...")``: name the cause."""
    chain = _causes(error)
    task = _failed_task(chain, error)
    offline = [e for e in chain if isinstance(e, ConnectionError) or "not cached" in str(e)]
    missing_file = [e for e in chain if isinstance(e, FileNotFoundError) and "Unable to find" in str(e)]
    if offline:
        import datasets

        offline_flags = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v, "0") not in ("", "0")]
        where = (
            f"{' and '.join(offline_flags)} {'is' if len(offline_flags) == 1 else 'are'} set here: if this machine "
            "can reach the Hub, unset them."
            if offline_flags
            else "This machine could not reach the Hub."
        )
        return EvalDatasetError(
            f"task {task}: its dataset is not available ({offline[0]}). lm-eval downloads task data from the "
            f"Hugging Face Hub into the HF datasets cache ({datasets.config.HF_DATASETS_CACHE}). To make it "
            "available offline, run once where the Hub is reachable, with HF_DATASETS_OFFLINE and HF_HUB_OFFLINE "
            "unset or 0: `python -m levanter_mars.main.eval_harness --config_path <this suite> --download_only "
            f"true`, then use that cache here (same HF_HOME or HF_DATASETS_CACHE, or copy the directory). {where}"
        )
    if missing_file:
        return EvalDatasetError(
            f"task {task}: a data file is missing ({missing_file[0]}). Paths in a task YAML's "
            f"dataset_kwargs.data_files are relative to the working directory ({os.getcwd()})."
        )
    return None
