"""Every workaround for a defect of the pinned Levanter (1.2.dev1644), in one place.

Each one names the defect it works around; ``tests/test_upstream_workarounds.py`` reproduces each defect against
the installed Levanter, so that the day upstream fixes one, its test fails and the workaround can be deleted.
Defects that need no code here (only a pin or a default) are listed too, with where they are handled.

1. ``LambdaCallback.on_step(info, force)`` drops ``force``, so the end-of-training checkpoint is never written:
   :func:`forward_force_to_checkpointer`.
2. ``Trainer._train_step``'s ``obj_fun`` unpacks ``(loss, metrics)`` from a loss function that returns one value,
   is not microbatched, and ``take_train_step`` passes ``loss=`` along: the trainer builds its own objective
   (:class:`levanter_mars.training.trainer.BatchObjective`), and MARS calls ``obj_fn(params)`` only.
3. ``Gpt2Config.hf_checkpoint_converter`` hard-codes ``reference_checkpoint="gpt2"`` and so contacts the HF hub
   on every run: :func:`offline_gpt2_converter`.
4. ``train_lm.main`` constructs ``levanter.trainer.Trainer`` itself, with no way to pass a subclass:
   :func:`use_trainer_class`.
5. Training ends quietly when the data runs out before ``num_train_steps``: ``MarsTrainer.train`` raises instead.
6. Not declared by Levanter: ``chex`` (``levanter.optim``) and ``GitPython`` (``levanter.tracker``): pinned in
   ``pyproject.toml``.
7. Levanter's loss passes a float ``where=`` mask, an error from jax 0.8: ``jax==0.7.2`` is pinned.
8. Levanter's own ``mars`` calls ``jax.tree_map`` (removed from jax): we register ``mars-*`` names instead, and
   the benchmarks patch it while they build and trace it (``levanter_mars.bench.optimizers.levanter_mars_workaround``).
9. The default tracker (wandb, online) fails without an API key: ``MarsTrainerConfig`` defaults to offline wandb.
10. ``DataLoaderIterator`` starts a prefetch thread at construction and has no public way to stop it; if the
    process exits while it is still reading (a run resumed when already complete, or stopped by an error), the
    interpreter aborts (``terminate called ...``, exit 134): :func:`stop_data_loader`.
11. ``LmEvalHarnessConfig.to_task_dict`` builds ``lm_eval.tasks.TaskManager()`` with no ``include_path``, and
    lm-eval 0.4.11 does not accept a task YAML path as a task name, so a local task (a YAML file, or a directory of
    them) cannot be evaluated: :func:`lm_eval_task_manager`.
12. At the end of ``train_lm.main`` the hooks are forced twice (``Trainer.train`` forces them, then ``main`` does
    again when ``epoch > 0``), so Levanter's eval-harness hook evaluates the final step twice; it also logs with
    ``step=None`` and keeps the results JSON only as a tracker artifact in a temporary file:
    :func:`use_eval_harness_hook` installs :class:`levanter_mars.eval.in_training.EvalHarnessHook` instead.
13. The eval harness fails on a mesh of more than one device in one process ("Received incompatible devices for
    jitted computation"): ``_LmEvalHarnessWorker.dispatch_loglikelihood`` drops the placed copy of the batch that
    ``_send_payload`` returns and passes the batch as packed, committed to device 0: :func:`eval_harness_on_mesh`.
14. ``levanter.infra.tpus.get_current_tpu_is_preempted`` (``run_on_pod``'s health check of every slice, every
    10 s, and its sorting of failures) asks the GCE metadata server, without a timeout, and raises where there is
    none, so off GCP every attempt is torn down as unhealthy: the local engine's Ray workers answer "not
    preempted" without the network (:func:`preemption_probe_off_gce`).
15. ``Checkpointer`` deletes a superseded temporary checkpoint at ``join(base_path, path)`` where ``path`` already
    starts with ``base_path``: with a relative base path (``runs/checkpoints`` in the shipped CPU configs) that names
    nothing, the deletion fails (a logged traceback) and every temporary checkpoint stays on disk:
    :func:`checkpointer_base_path`.

Defects of other pinned dependencies that reach this project's runs:

16. ``datasets`` (under lm-eval) sends a HEAD request to s3.amazonaws.com for every load of a packaged builder
    (``json``, ``csv``) unless ``HF_HUB_OFFLINE`` is set, so even a suite of local tasks reaches the network:
    :func:`no_datasets_download_counts`.
17. wandb 0.31's ``wandb-core`` resolves its API host at shutdown when offline mode comes only from
    ``wandb.init(mode=...)``: :func:`levanter_mars.training.run.wandb_offline_unless_configured` also sets
    ``WANDB_MODE``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator

from levanter.callbacks import Callback, LambdaCallback
from levanter.checkpoint import Checkpointer

logger = logging.getLogger(__name__)


class _ForceForwardingCallback(Callback):
    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def on_step(self, info, force: bool = False):
        self.fn(info, force=force)


def forward_force_to_checkpointer(hooks: list) -> Checkpointer | None:
    """Defect 1. Rewraps the trainer's checkpointer hook so that ``run_hooks(force=True)`` reaches it.

    Returns the checkpointer (or None if the trainer has none).
    """
    found = None
    for hook in hooks:
        fn = hook.fn
        if isinstance(fn, LambdaCallback) and isinstance(getattr(fn.fn, "__self__", None), Checkpointer):
            found = fn.fn.__self__
            hook.fn = _ForceForwardingCallback(fn.fn)
    return found


def offline_gpt2_converter(tokenizer: Any) -> Callable[..., Any]:
    """Defect 3. A ``Gpt2Config.hf_checkpoint_converter`` that builds the HF config locally and uses ``tokenizer``.

    Saving (``hf_save_path``) copies ``architectures`` from the reference checkpoint's config; with no reference,
    the stock converter raises, so the offline one supplies GPT-2's own."""
    import functools

    import transformers
    from levanter.compat.hf_checkpoints import HFCheckpointConverter

    class OfflineHFCheckpointConverter(HFCheckpointConverter):
        @functools.cached_property
        def default_hf_config(self):
            if self.reference_checkpoint is None:
                return transformers.GPT2Config(architectures=["GPT2LMHeadModel"])
            return self.hf_config_from_hf_checkpoint(None)

    def hf_checkpoint_converter(self, ref_checkpoint: str | None = None):
        return OfflineHFCheckpointConverter(
            self.__class__,
            reference_checkpoint=ref_checkpoint,
            HfConfigClass=transformers.GPT2Config,
            tokenizer=tokenizer,
            ignore_prefix="transformer",
        )

    return hf_checkpoint_converter


def stop_data_loader(iterator: Any) -> None:
    """Defect 10. Stops a ``DataLoaderIterator``'s background prefetching (what its ``__del__`` does)."""
    background = getattr(iterator, "_batches", None)
    if background is not None and hasattr(background, "stop"):
        background.stop()


@contextlib.contextmanager
def patched(target: Any, **attributes: Any) -> Iterator[None]:
    """Temporarily sets attributes on a module or class, restoring them afterwards."""
    missing = object()
    saved = {name: getattr(target, name, missing) for name in attributes}
    for name, value in attributes.items():
        setattr(target, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(target, name)
            else:
                setattr(target, name, value)


@contextlib.contextmanager
def use_trainer_class(trainer_factory: Callable[..., Any]) -> Iterator[None]:
    """Defect 4. Makes ``levanter.main.train_lm.main`` construct ``trainer_factory`` instead of ``Trainer``."""
    import levanter.main.train_lm as train_lm

    with patched(train_lm, Trainer=trainer_factory):
        yield


@contextlib.contextmanager
def gpt2_without_hub(tokenizer: Any) -> Iterator[None]:
    """Defect 3, applied for the duration of a run."""
    from levanter.models.gpt2 import Gpt2Config

    with patched(Gpt2Config, hf_checkpoint_converter=offline_gpt2_converter(tokenizer)):
        yield


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


@contextlib.contextmanager
def use_eval_harness_hook(hook_factory: Callable[..., Any]) -> Iterator[None]:
    """Defect 12. Makes ``train_lm.main`` build its eval-harness hook with ``hook_factory(config, tokenizer,
    EvalBatch, axis_resources, mp)``, the signature of ``levanter.eval_harness.lm_eval_harness``."""
    import levanter.eval_harness

    with patched(levanter.eval_harness, lm_eval_harness=hook_factory):
        yield


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


def _not_preempted() -> bool:
    return False


def preemption_probe_off_gce() -> None:
    """Defect 14. Replaces Levanter's GCE preemption probe in this process (a local-engine Ray worker)."""
    import importlib

    # Through sys.modules: this may run while the module is still being imported (infra/local_worker.py).
    tpus = importlib.import_module("levanter.infra.tpus")
    tpus.get_current_tpu_is_preempted = _not_preempted


def checkpointer_base_path(path: str) -> str:
    """A local checkpoint base path made absolute (defect 15): joining it with itself is then a no-op."""
    return path if "://" in path else os.path.abspath(path)


@contextlib.contextmanager
def no_datasets_download_counts() -> Iterator[None]:
    """Keeps ``datasets`` from reporting loads of its packaged builders to Hugging Face (defect 16).

    Nothing depends on the count; without this, the offline ``pydocs_mc`` task made a network attempt (and waited
    for its timeout where DNS hangs).
    """
    import datasets

    saved = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved
