"""The eval harness during training: every ``eval_harness_steps`` steps and once at the end. An evaluation never
ends training unless asked to.

The entry point installs :class:`EvalHarnessHook` instead of Levanter's own hook (defect 12 in
``levanter_mars.compat``). It runs the same evaluation as Levanter's hook, on the tasks loaded once, and logs the same
``lm_eval/<task>/<metric>`` metrics to the trackers (W&B and ``metrics.jsonl``), but evaluates each step once and
writes ``results.json``/``results.md`` into ``<run dir>/eval/in_training/step-N/``, next to what the standalone
evaluation writes.

A failed evaluation (a task whose data cannot be loaded, a task that errors while scoring, results that cannot be
written) is logged with the task and the reason, counted as ``eval_harness/failures`` in the metrics and in the goodput
record, and the suite runs again at the next scheduled evaluation; with ``eval_harness_failure: stop`` the run stops
instead (exit 6). A ``task_spec`` that names no task is a config error, before training starts. On a pod every
process agrees on the outcome (process 0 drives lm-eval and writes the results; the others serve its requests).
"""

from __future__ import annotations

import logging
import posixpath
from typing import Callable, Optional

import jax
import levanter.eval_harness
import levanter.tracker
from levanter.callbacks import Callback, StepInfo

from levanter_mars.compat.lm_eval_harness import FAILED_TO_LOAD, failing_task, run_eval_harness
from levanter_mars.eval import report
from levanter_mars.eval.suite import EvalSuiteConfig, TaskSpecError
from levanter_mars.training import distributed
from levanter_mars.training.errors import EVAL_FAILURE_POLICIES, EvalFailedError
from levanter_mars.training.run.goodput import clock as goodput_clock

logger = logging.getLogger(__name__)

IN_TRAINING = "in_training"
FAILURES_METRIC = "eval_harness/failures"

#: ``(step, task, reason)``: told of each failure on process 0 (the goodput record keeps them).
FailureListener = Callable[[int, str, str], None]


def results_dir(run_dir: str, step: int) -> str:
    return posixpath.join(str(run_dir), "eval", IN_TRAINING, f"step-{step}")


class EvalHarnessHook(Callback):
    """Runs the suite on ``info.eval_model``. ``run_dir`` and ``run_name`` say where results go and how rows read."""

    def __init__(self, config, tokenizer, EvalBatch, axis_resources, mp, *, run_dir: str, run_name: str,
                 on_failure: str = "continue", failure_listener: Optional[FailureListener] = None):  # fmt: skip
        if on_failure not in EVAL_FAILURE_POLICIES:
            raise ValueError(f"eval_harness_failure must be one of {EVAL_FAILURE_POLICIES}, got {on_failure!r}")
        self.config = config
        self.tokenizer = tokenizer
        self.EvalBatch = EvalBatch
        self.axis_resources = axis_resources
        self.mp = mp
        self.run_dir = run_dir
        self.run_name = run_name
        self.on_failure = on_failure
        self.failure_listener = failure_listener
        self.failures = 0
        self._evaluated: set[int] = set()
        # Loaded once, before training starts: a task whose data is missing is reported before step 1 (and, unless
        # the policy is stop, tried again at each evaluation).
        self.tasks: Optional[dict] = None
        load_failure = self._load_tasks()
        if load_failure is not None:
            message = f"eval harness: {load_failure[0]}: {load_failure[1]}"
            if on_failure == "stop":
                raise EvalFailedError(f"{message} (eval_harness_failure=stop)")
            logger.error("%s. Training goes on; the tasks are loaded again at each evaluation", message)

    def _load_tasks(self) -> Optional[tuple[str, str]]:
        try:
            self.tasks = self.config.to_task_dict()
            return None
        except TaskSpecError:
            raise  # names no task: a config error
        except Exception as e:  # noqa: BLE001 - named and reported by the caller
            return _named(e, "loading the tasks")

    def on_step(self, info: StepInfo, force: bool = False):
        step = int(info.step)
        if (step == 0 and not force) or step in self._evaluated:
            return
        self._evaluated.add(step)
        logger.info("Running the eval harness at step %d", step)
        with goodput_clock.phase("eval"):
            failure = self._evaluate(info, step)
        if distributed.all_processes(failure is None):  # every process, once per evaluation
            return
        self._failed(step, failure or ("(another host)", "the evaluation failed on another host: see its log"))

    def _evaluate(self, info: StepInfo, step: int) -> Optional[tuple[str, str]]:
        """None, or ``(task, reason)``. Every process makes the same collective calls, whatever fails where."""
        failure = self._load_tasks() if self.tasks is None else None
        if not distributed.all_processes(self.tasks is not None):
            return failure or ("(another host)", "the tasks did not load on another host")
        try:
            outputs = run_eval_harness(
                self.config, info.eval_model, self.tasks, self.tokenizer, self.EvalBatch, self.axis_resources, self.mp
            )
        except Exception as e:  # noqa: BLE001 - process 0's lm-eval failed; every process left the harness
            if jax.process_index() != 0:
                raise  # a host that serves requests failed: the hosts are out of step, a crash
            return _named(e, "the model's requests")
        if jax.process_index() != 0:  # process 0 drove lm-eval; it alone logs and writes the results
            return None
        assert outputs is not None
        tracker = levanter.tracker.current_tracker()
        levanter.eval_harness.log_report_to_tracker("lm_eval", outputs, tracker)
        tracker.log({FAILURES_METRIC: self.failures}, step=step)
        columns = self.config.columns if isinstance(self.config, EvalSuiteConfig) else ()
        where = results_dir(self.run_dir, step)
        try:
            written = report.write_results(
                outputs, where, run_name=self.run_name, step=step, checkpoint=None, columns=columns
            )
        except Exception as e:  # noqa: BLE001 - the numbers are logged; only the files are missing
            return "(results)", f"cannot write the results to {where} ({type(e).__name__}: {e})"
        tracker.log_artifact(written.json_path, name=f"lm_eval_harness_results.{step}.json", type="lm_eval_output")
        return None

    def _failed(self, step: int, failure: tuple[str, str]) -> None:
        self.failures += 1
        task, reason = failure
        message = f"eval harness at step {step} failed: {task}: {reason}"
        if jax.process_index() == 0:
            levanter.tracker.current_tracker().log({FAILURES_METRIC: self.failures}, step=step)
            if self.failure_listener is not None:
                self.failure_listener(step, task, reason)
        if self.on_failure == "stop":
            raise EvalFailedError(f"{message} (eval_harness_failure=stop)")
        logger.error("%s. Training goes on (eval_harness_failure=continue); the suite runs again at the next "
                     "scheduled evaluation", message)  # fmt: skip


def _named(error: BaseException, otherwise: str) -> tuple[str, str]:
    """``(task, reason)`` of a failure: the task lm-eval was in, or the one a load error names, else ``otherwise``."""
    task, text = failing_task(error), str(error)
    if task is None and text.startswith("task ") and ":" in text:  # EvalDatasetError: "task <name>: ..."
        task = text.split(":", 1)[0].removeprefix("task ")
    if task is None and text.startswith(FAILED_TO_LOAD):  # TaskErrorsNamed: "Failed to load task <name>"
        task = text.removeprefix(FAILED_TO_LOAD).split()[0]
    return task or otherwise, f"{type(error).__name__}: {error}"


def install(trainer, suite: EvalSuiteConfig, every: int, tokenizer, *, run_dir: str, on_failure: str = "continue",
            failure_listener: Optional[FailureListener] = None) -> None:  # fmt: skip
    """Adds the suite's hook to a training run (every ``every`` steps and at the end)."""
    hook = EvalHarnessHook(
        suite, tokenizer, trainer.config.EvalBatch, trainer.compute_axis_mapping, trainer.mp,
        run_dir=run_dir, run_name=trainer.run_id, on_failure=on_failure, failure_listener=failure_listener,
    )
    trainer.add_hook(hook, every=every)
