"""Fault injection for end-to-end tests, installed in the training subprocess before the CLI runs.

Each ``install_*`` function patches one library seam and is activated through ``prelude(...)``, the Python source
``tests.helpers.training.run_cli(..., prelude=...)`` runs first. Production code has no fault hooks.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Mapping, Optional


def prelude(function: str, **kwargs) -> str:
    arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"import tests.helpers.faults as _faults\n_faults.{function}({arguments})"


def _is_step_dir(path: str, step: int) -> bool:
    return str(path).rstrip("/").endswith(f"step-{step}")


def _kill_at_manifest(target: int, *, after: bool) -> None:
    from levanter_mars.training.checkpointing import manifest

    original = manifest.write_manifest

    def write_manifest(checkpoint_path, *, step: int, run_info=None):
        if step == target and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        written = original(checkpoint_path, step=step, run_info=run_info)
        if step == target and after:
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    manifest.write_manifest = write_manifest


def install_kill_before_manifest(step: int) -> None:
    """SIGKILL after ``metadata.json`` of ``step-<step>`` is written but before its manifest is."""
    _kill_at_manifest(step, after=False)


def install_kill_after_manifest(step: int) -> None:
    """SIGKILL as soon as checkpoint ``step-<step>`` is complete (its manifest written): no test has to catch the
    moment by polling."""
    _kill_at_manifest(step, after=True)


def install_kill_at_step(step: int, once_exists: Optional[str] = None, process: Optional[int] = None) -> None:
    """SIGKILL as training step ``step`` is about to run, or at the first step after it at which ``once_exists`` (a
    checkpoint's manifest, local or gs://) exists; with ``process``, only in that process of a pod. A kill at a chosen
    step of a live run: no test has to catch the moment by polling."""
    import jax

    from levanter_mars.training.checkpointing.storage import fs_and_path
    from levanter_mars.training.trainer import MarsTrainer

    original_step = MarsTrainer.train_step

    def exists(path: str) -> bool:
        fs, plain = fs_and_path(path)
        fs.invalidate_cache()  # object-store listings are cached: look again at each step
        return fs.exists(plain)

    def train_step(self, state, *batch, **batch_kwargs):
        # Every process of a pod does the same reads, step by step (a host reading the step alone could fall out of
        # step with the others' collectives); only the chosen one is killed.
        if int(state.step) >= step and (once_exists is None or exists(once_exists)):
            if process is None or jax.process_index() == process:
                os.kill(os.getpid(), signal.SIGKILL)
        return original_step(self, state, *batch, **batch_kwargs)

    MarsTrainer.train_step = train_step


def install_sigterm_at_step(step: int, process: Optional[int] = None) -> None:
    """A preemption notice: SIGTERM to this process (with ``process``, only that process of a pod) as training step
    ``step`` is about to run, once, delivered by the kernel like a cloud's. Nothing else is patched: what the run does
    with it is the program's own."""
    import jax

    from levanter_mars.training.trainer import MarsTrainer

    original_step = MarsTrainer.train_step
    sent = []

    def train_step(self, state, *batch, **batch_kwargs):
        if int(state.step) >= step and not sent and (process is None or jax.process_index() == process):
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)
        return original_step(self, state, *batch, **batch_kwargs)

    MarsTrainer.train_step = train_step


def install_slow_checkpoint_write(step: int, seconds: float) -> None:
    """Checkpoint ``step-<step>``'s arrays take ``seconds`` more to be written (in the background writer, before its
    commit): a save on slow storage."""
    import time

    class _Slow:
        def __init__(self, manager):
            self.manager = manager

        def serialize_with_paths(self, arrays, paths, on_commit_callback=None):
            def commit():
                time.sleep(seconds)
                if on_commit_callback is not None:
                    on_commit_callback()

            self.manager.serialize_with_paths(arrays, paths, on_commit_callback=commit)

        def __getattr__(self, name):
            return getattr(self.manager, name)

    _intercept_save(step, _Slow)


def install_pause_at_step(step: int, signal_path: str) -> None:
    """Stops as training step ``step`` is about to run, alive (its threads run on), after writing ``signal_path``: a
    live run held still for as long as a test needs, until it is killed."""
    import time

    from levanter_mars.training.trainer import MarsTrainer

    original_step = MarsTrainer.train_step

    def train_step(self, state, *batch, **batch_kwargs):
        if int(state.step) >= step:
            with open(signal_path, "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(1)
        return original_step(self, state, *batch, **batch_kwargs)

    MarsTrainer.train_step = train_step


class _PartialWriter:
    """Stands in for the checkpoint manager of one save: writes the first half of the arrays, then runs ``finish``
    in the manager's background commit thread instead of the real commit (which would write metadata.json)."""

    def __init__(self, manager, finish):
        self.manager, self.finish = manager, finish

    def serialize_with_paths(self, arrays, paths, on_commit_callback=None):
        half = max(1, len(arrays) // 2)
        self.manager.serialize_with_paths(arrays[:half], paths[:half], on_commit_callback=self.finish)

    def __getattr__(self, name):
        return getattr(self.manager, name)


def _intercept_save(step: int, make_manager) -> None:
    import levanter.checkpoint as lc

    original = lc.tree_serialize_leaves_tensorstore

    def serialize(checkpoint_path, tree, manager=None, *args, **kwargs):
        if _is_step_dir(checkpoint_path, step):
            manager = make_manager(manager)
        return original(checkpoint_path, tree, manager, *args, **kwargs)

    lc.tree_serialize_leaves_tensorstore = serialize


def install_kill_during_checkpoint_write(step: int) -> None:
    """Checkpoint ``step-<step>`` writes half of its arrays, then the process is SIGKILLed: a torn checkpoint with
    some arrays on disk and no ``metadata.json``, exactly what a preemption in the middle of a write leaves."""
    _intercept_save(step, lambda m: _PartialWriter(m, lambda: os.kill(os.getpid(), signal.SIGKILL)))


def install_disk_full_at_checkpoint(step: int, asynchronous: bool = False) -> None:
    """Makes writing checkpoint ``step-<step>`` fail with ENOSPC: synchronously when the write starts, or in the
    background writer after half of the arrays are on disk (as a disk that fills up mid-write would)."""
    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    if asynchronous:
        _intercept_save(step, lambda m: _PartialWriter(m, full))
    else:
        def failing_manager(manager):
            full()

        _intercept_save(step, failing_manager)


def install_poisoned_batches(scales: Mapping[int, float | str]) -> None:
    """Multiplies the training loss of the given steps' batches by a factor: ``"nan"`` makes a NaN batch,
    ``1e6`` a huge-gradient one. The factor is a traced argument, so the step compiles once. The exact-mode objective
    sees the same batch, hence the same factor."""
    import jax.numpy as jnp
    import levanter_mars.training.lm as train_lm

    from levanter_mars.training.trainer import MarsTrainer

    original_loss = train_lm.compute_next_token_loss

    def loss(model, example, *args, loss_scale=None, **kwargs):
        value = original_loss(model, example, *args, **kwargs)
        return value if loss_scale is None else value * loss_scale

    train_lm.compute_next_token_loss = loss
    original_step = MarsTrainer.train_step
    factors = {int(k): float(v) for k, v in scales.items()}

    def train_step(self, state, *batch, **batch_kwargs):
        scale = factors.get(int(state.step), 1.0)
        return original_step(self, state, *batch, loss_scale=jnp.asarray(scale, jnp.float32), **batch_kwargs)

    MarsTrainer.train_step = train_step


def install_eval_failures(scoring_fails_at_eval: int, writing_fails_at_step: int) -> None:
    """In-training evaluations that fail: the ``scoring_fails_at_eval``-th evaluation (counting from 1) raises inside
    the task's own scoring (lm-eval's ``process_results``), and writing the results of the evaluation at
    ``writing_fails_at_step`` fails as a full disk would."""
    from lm_eval.api.task import ConfigurableTask

    from levanter_mars.eval import in_training, report

    evaluations = []
    run_eval_harness = in_training.run_eval_harness

    def counting_evaluations(*args, **kwargs):
        evaluations.append(True)
        return run_eval_harness(*args, **kwargs)

    process_results = ConfigurableTask.process_results

    def scoring(self, doc, results):
        if len(evaluations) == scoring_fails_at_eval:
            raise ValueError("injected: the task's scoring failed")
        return process_results(self, doc, results)

    write_results = report.write_results

    def writing(outputs, directory, *, step, **kwargs):
        if step == writing_fails_at_step:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_results(outputs, directory, step=step, **kwargs)

    in_training.run_eval_harness = counting_evaluations
    ConfigurableTask.process_results = scoring
    report.write_results = writing


def install_first_batches_probe(out: str, batches: int = 2) -> None:
    """Writes to ``out`` (JSON) what a run starts from, then exits 0 before its first step: a digest of its initial
    parameters, the token ids of its first ``batches`` batches, and the loss of the initial parameters on the first
    (the trainer's own loss function). A fairness probe, not a fault."""
    import hashlib
    import json

    import equinox as eqx
    import jax
    import numpy as np

    from levanter_mars.training.trainer import MarsTrainer

    def train(self, state, train_loader):
        loader = iter(train_loader)
        first = [next(loader) for _ in range(batches)]
        digest = hashlib.sha256()
        for leaf in jax.tree.leaves(eqx.filter(state.model, eqx.is_array)):
            digest.update(np.asarray(leaf).tobytes())

        @eqx.filter_jit
        def loss(model, batch):
            return self.loss_fn(self.mp.cast_to_compute(model), batch, key=None)[0]

        with open(out, "w") as f:
            json.dump({"parameters_sha256": digest.hexdigest(),
                       "token_ids": [np.asarray(b.tokens.array).tolist() for b in first],
                       "initial_loss": float(loss(state.model, first[0]))}, f)  # fmt: skip
        os._exit(0)

    MarsTrainer.train = train
