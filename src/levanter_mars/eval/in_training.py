"""The eval harness during training: every ``eval_harness_steps`` steps and once at the end.

The entry point installs :class:`EvalHarnessHook` instead of Levanter's own hook (defect 12 in
``levanter_mars.compat``). It runs the same evaluation as Levanter's hook, on the tasks loaded once, and logs the same ``lm_eval/<task>/<metric>`` metrics to the trackers (W&B and
``metrics.jsonl``), but evaluates each step once and writes ``results.json``/``results.md`` into
``<run dir>/eval/in_training/step-N/``, next to what the standalone evaluation writes.
"""

from __future__ import annotations

import logging
import posixpath
import jax
import levanter.eval_harness
import levanter.tracker
from levanter.callbacks import Callback, StepInfo

from levanter_mars.compat.lm_eval_harness import run_eval_harness
from levanter_mars.eval import report
from levanter_mars.eval.suite import EvalSuiteConfig

logger = logging.getLogger(__name__)

IN_TRAINING = "in_training"


def results_dir(run_dir: str, step: int) -> str:
    return posixpath.join(str(run_dir), "eval", IN_TRAINING, f"step-{step}")


class EvalHarnessHook(Callback):
    """Runs the suite on ``info.eval_model``. ``run_dir`` and ``run_name`` say where results go and how rows read."""

    def __init__(self, config, tokenizer, EvalBatch, axis_resources, mp, *, run_dir: str, run_name: str):
        self.config = config
        self.tokenizer = tokenizer
        self.EvalBatch = EvalBatch
        self.axis_resources = axis_resources
        self.mp = mp
        self.run_dir = run_dir
        self.run_name = run_name
        # Loaded once, before training starts, so a missing dataset stops the run before step 1.
        self.tasks = config.to_task_dict()
        self._evaluated: set[int] = set()

    def on_step(self, info: StepInfo, force: bool = False):
        step = int(info.step)
        if (step == 0 and not force) or step in self._evaluated:
            return
        self._evaluated.add(step)
        logger.info("Running the eval harness at step %d", step)
        outputs = run_eval_harness(
            self.config, info.eval_model, self.tasks, self.tokenizer, self.EvalBatch, self.axis_resources, self.mp
        )
        if jax.process_index() != 0:  # process 0 drove lm-eval; it alone logs and writes the results
            return
        assert outputs is not None
        tracker = levanter.tracker.current_tracker()
        levanter.eval_harness.log_report_to_tracker("lm_eval", outputs, tracker)
        columns = self.config.columns if isinstance(self.config, EvalSuiteConfig) else ()
        written = report.write_results(
            outputs, results_dir(self.run_dir, step), run_name=self.run_name, step=step, checkpoint=None,
            columns=columns,
        )
        tracker.log_artifact(written.json_path, name=f"lm_eval_harness_results.{step}.json", type="lm_eval_output")


def install(trainer, suite: EvalSuiteConfig, every: int, tokenizer, *, run_dir: str) -> None:
    """Adds the suite's hook to a training run (every ``every`` steps and at the end)."""
    hook = EvalHarnessHook(
        suite, tokenizer, trainer.config.EvalBatch, trainer.compute_axis_mapping, trainer.mp,
        run_dir=run_dir, run_name=trainer.run_id,
    )
    trainer.add_hook(hook, every=every)
