"""Levanter's lm-eval harness and lm-eval/datasets themselves (defects 11, 12, 13, 16, 22, 27, 30, 39; 20 in
lm_eval_scoring)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from levanter.eval_harness import LmEvalHarnessConfig

from levanter_mars.compat.lm_eval_scoring import score_as_lm_eval
from levanter_mars.compat.patching import patched


@contextlib.contextmanager
def lm_eval_task_manager(include_path: list[str], include_defaults: bool = True) -> Iterator[None]:
    """Defect 11. Every ``lm_eval.tasks.TaskManager()`` made meanwhile also indexes the task YAMLs under
    ``include_path``; with ``include_defaults=False`` it skips lm-eval's ~14,000 built-in tasks (5 s to index)."""
    import lm_eval.tasks

    base = lm_eval.tasks.TaskManager

    class TaskManagerWithLocalTasks(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("include_path", list(include_path) or None)
            kwargs.setdefault("include_defaults", include_defaults)
            super().__init__(*args, **kwargs)

    with patched(lm_eval.tasks, TaskManager=TaskManagerWithLocalTasks):
        yield


def run_eval_harness(config, model, tasks, tokenizer, EvalBatch, axis_resources, mp):
    """Defect 12. Levanter's evaluation of already-loaded ``tasks`` (what its own hook runs), on every process:
    process 0 drives lm-eval, the others serve its requests. Each request is scored as lm-eval scores it (defect 20).
    Returns the outputs on process 0, None elsewhere."""
    import levanter.eval_harness

    with eval_harness_on_mesh(), broadcasts_across_processes(), score_as_lm_eval(), workers_released_on_failure():
        return levanter.eval_harness._actually_run_eval_harness(
            config, model, tasks, tokenizer, EvalBatch, axis_resources, mp
        )


@contextlib.contextmanager
def eval_harness_on_mesh() -> Iterator[None]:
    """Defect 13. Places each packed eval batch on the mesh (batch axis over the data axis) before the jitted
    log-likelihood, as the workers' copy already is. Single- and multi-process alike."""
    import haliax as hax
    from levanter.eval_harness import _LmEvalHarnessWorker, _Message

    def dispatch_loglikelihood(self, packed_request):
        self._send_message(_Message.LOGLIKELIHOOD)
        packed_request = hax.shard(self._send_payload(packed_request), self.axis_resources)
        return self.process_loglikelihood(packed_request)

    with patched(_LmEvalHarnessWorker, dispatch_loglikelihood=dispatch_loglikelihood):
        yield


@contextlib.contextmanager
def legacy_mesh_context() -> Iterator[None]:
    """The current ``jax.set_mesh`` mesh, entered the pre-``set_mesh`` way (``with mesh:``): Levanter's helpers still
    find it, but ``jnp`` results stay on this process's devices instead of being replicated over the whole mesh."""
    from jax._src import config
    from jax._src.mesh import get_concrete_mesh

    mesh = get_concrete_mesh()
    unset = config.config_ext.unset
    previous_abstract = config.abstract_mesh_context_manager.swap_local(unset)
    previous_devices = config.device_context.swap_local(unset)
    try:
        with mesh:
            yield
    finally:
        config.abstract_mesh_context_manager.set_local(previous_abstract)
        config.device_context.set_local(previous_devices)


@contextlib.contextmanager
def broadcasts_across_processes() -> Iterator[None]:
    """Defect 22. Levanter's ``broadcast_shard`` (how process 0 sends the other processes each eval message and
    batch) builds its per-device inputs with ``jnp`` ops; under ``jax.set_mesh`` those are replicated over the whole
    mesh, which with more than one process is not addressable, and ``make_array_from_callback`` refuses them
    ("device_put's first argument must be a fully addressable array"). With one process nothing changes."""
    import jax
    import levanter.eval_harness

    original = levanter.eval_harness.broadcast_shard

    def broadcast_shard(x, out_axis_specs, source: int = 0):
        if jax.process_count() == 1:
            return original(x, out_axis_specs, source)
        with legacy_mesh_context():
            return original(x, out_axis_specs, source)

    with patched(levanter.eval_harness, broadcast_shard=broadcast_shard):
        yield


@contextlib.contextmanager
def no_datasets_download_counts() -> Iterator[None]:
    """Defect 16. Keeps ``datasets`` from reporting loads of its packaged builders to Hugging Face.

    Nothing depends on the count; without this, the offline ``pydocs_mc`` task made a network attempt (and waited
    for its timeout where DNS hangs).
    """
    import datasets

    with patched(datasets.config, HF_UPDATE_DOWNLOAD_COUNTS=False):
        yield


FAILED_TO_LOAD = "Failed to load task "


@contextlib.contextmanager
def task_load_failures_unlogged() -> Iterator[None]:
    """Defect 30. Levanter logs the whole traceback of a task that fails to load (``logger.exception``) and then
    raises it anyway: the caller reports it once, in one line. Other records of Levanter's harness still show."""
    import logging

    class NotTaskLoadFailures(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith(FAILED_TO_LOAD)

    harness_logger = logging.getLogger("levanter.eval_harness")
    quiet = NotTaskLoadFailures()
    harness_logger.addFilter(quiet)
    try:
        yield
    finally:
        harness_logger.removeFilter(quiet)


@dataclasses.dataclass(frozen=True)
class TaskErrorsNamed(LmEvalHarnessConfig):
    """Defect 27. lm-eval pops ``task`` from a dict entry while loading it, so Levanter's error for a task that fails
    to load does not name it; this config's error does (``FAILED_TO_LOAD`` + name), with the cause attached."""

    def _get_task_and_rename(self, manager, our_name, task):
        try:
            return super()._get_task_and_rename(manager, our_name, task)
        except Exception as e:  # noqa: BLE001 - reported with the task's name, cause attached
            raise ValueError(f"{FAILED_TO_LOAD}{our_name}") from e


@contextlib.contextmanager
def workers_released_on_failure() -> Iterator[None]:
    """Defect 39. Levanter's harness sends its other processes the STOP message only after lm-eval's ``evaluate``
    returns on process 0: when lm-eval fails there (a task that errors while scoring), they wait for requests forever
    and the pod hangs. Here process 0 sends STOP on the way out of a failure too, so every process leaves the harness
    and the failure can be handled in step. With one process, STOP is a no-op."""
    import levanter.eval_harness

    evaluator = levanter.eval_harness.evaluator
    evaluate = evaluator.evaluate

    def evaluate_then_release(lm, *args, **kwargs):
        try:
            return evaluate(lm, *args, **kwargs)
        except BaseException:
            lm.leader.stop()
            raise

    with patched(evaluator, evaluate=evaluate_then_release):
        yield


def failing_task(error: BaseException) -> str | None:
    """Defect 39. The lm-eval task in whose own code ``error`` was raised (building its requests, filtering, scoring),
    from the traceback: lm-eval's ``evaluate`` does not say. None when it came from elsewhere (the model's
    requests)."""
    from lm_eval.api.task import Task

    name = None
    traceback = error.__traceback__
    while traceback is not None:  # outermost first: the innermost task frame wins
        owner = traceback.tb_frame.f_locals.get("self")
        if isinstance(owner, Task):
            name = getattr(owner, "task_name", None) or getattr(getattr(owner, "config", None), "task", None)
        traceback = traceback.tb_next
    return str(name) if name else None
