"""``python -m levanter_mars.main.train_lm --config_path config/<file>.yaml [--section.field value ...]``

The program's order, on one process or on every host of a pod alike: parse; start ``jax.distributed`` (nothing
touches a JAX backend before it); take the run's lease (one live launch per run, ``training/run/lease.py``); validate;
point JAX at the run's compilation cache; prepare what is shared (corpus, token caches, set-asides, the resume
decision: process 0 acts, the others wait for its answer); open the goodput record (process 0); build; train;
summarize (process 0); release the lease. The exit code says how it ended (``training/errors.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Optional, Sequence

import levanter

import levanter_mars.optim.levanter_config  # noqa: F401  (registers the mars-* optimizer types)
from levanter_mars.compat.levanter_logging import log_file_named_by_run_id
from levanter_mars.compat.tracking import only_process_zero_tracks, wandb_offline_unless_configured
from levanter_mars.eval import in_training
from levanter_mars.eval.suite import EvalDatasetError, TaskSpecError
from levanter_mars.program_config import TrainAndEvalConfig, parse_train_config
from levanter_mars.program_logging import set_up_program_logging
from levanter_mars.training import compilation_cache, distributed, pod_start, validation
from levanter_mars.training.checkpointing.resume import plan_resume
from levanter_mars.training.config import ConfigError
from levanter_mars.training.data import cache_check, pydocs_corpus
from levanter_mars.training.data import sources as data
from levanter_mars.training.errors import ERROR_EXIT_CODES, ExitCode, Preempted, RunLeasedError
from levanter_mars.training.lm import train_lm
from levanter_mars.training.run import fresh, record_copy
from levanter_mars.training.run import lease as run_lease
from levanter_mars.training.run.goodput import GoodputRecord
from levanter_mars.training.run.goodput import clock as goodput_clock
from levanter_mars.training.run.identity import checkpoint_dir, describe_run, run_dir, stable_run_id
from levanter_mars.training.run.launch_id import LAUNCH_ID_ENV, SLICE_CHANGE_ENV
from levanter_mars.training.run.summary import RunSummary, summarize

logger = logging.getLogger(__name__)


def main(config: TrainAndEvalConfig) -> Optional[RunSummary]:
    """Runs (or resumes) training. Raises ConfigError before any compilation if the config is bad. Returns the
    summary on process 0, None on the other hosts."""
    clock = goodput_clock.start()  # this attempt's time, from its launch
    set_up_program_logging()

    pod_start.start(config.trainer)
    config.trainer.id = stable_run_id(config)
    # One live launch per run: refused here, before the data or the model is looked at and nothing of the run touched
    # (a second launch learns it in the seconds its imports take).
    lease = run_lease.acquire_for(config)
    try:
        if config.embedded_corpus:
            validation.check_embedded_corpus(config)  # before the corpus is built from it
            distributed.leader_decides(
                lambda: bool(pydocs_corpus.prepare(config.embedded_corpus, config.embedded_corpus_sources)))
        validation.validate(config)
        return _train(config, clock, lease)
    finally:
        if lease is not None:
            lease.release()


def _train(config: TrainAndEvalConfig, clock, lease: Optional[run_lease.RunLease]) -> Optional[RunSummary]:
    compilation_cache.enable(config.trainer)
    wandb_offline_unless_configured(config.trainer)
    only_process_zero_tracks(config.trainer)

    # Process 0 holds every token cache to its provenance record (a mismatch raises ConfigError on every host), moves
    # caches aside for data.rebuild_cache and records the caches about to be built.
    distributed.leader_decides(lambda: cache_check.check_and_prepare(config.data).to_json())
    distributed.leader_decides(lambda: data.build_local_caches(config.data))
    distributed.leader_decides(lambda: fresh.prepare(config))  # fresh=true, or a set-aside a preemption cut short
    run_info = describe_run(config)
    resume = None
    if config.trainer.load_checkpoint is not False:
        resume = plan_resume(
            config.trainer.load_checkpoint_path or checkpoint_dir(config), run_info,
            verify_checksums=config.trainer.checkpointer.verify_checksums,
        )
    record = None
    if distributed.is_leader():  # before anything else reads metrics.jsonl: what a dead attempt left is still there
        record = GoodputRecord.open(run_dir(config), clock, os.environ.get(LAUNCH_ID_ENV),
                                    slices=config.trainer.num_slices, slice_change=os.environ.get(SLICE_CHANGE_ENV))

    with log_file_named_by_run_id():
        levanter.initialize(config)
    try:
        train_lm(config, run_info=run_info, resume=resume, add_hooks=_eval_hooks(config, record), goodput=record,
                 lease=lease)
    except BaseException as e:
        if record is not None and not (isinstance(e, RunLeasedError) and lease is not None and lease.lost):
            if isinstance(e, Preempted):
                record.preempted(e.saved_step, getattr(e, "save_s", None))
            record.close(exit_code(e), f"{type(e).__name__}: {e}")
        raise
    if record is not None:
        record.close(ExitCode.DONE, "done")
    if not distributed.is_leader():
        return None
    summary = summarize(config)
    record_copy.copy_beside_checkpoints(config)  # what outlives host 0's disk, for whoever reads the run elsewhere
    return summary


def _eval_hooks(config: TrainAndEvalConfig, record: Optional[GoodputRecord]):
    def add(trainer, tokenizer) -> None:
        if config.eval_harness is not None:
            in_training.install(
                trainer, config.eval_harness, config.eval_harness_steps, tokenizer, run_dir=str(run_dir(config)),
                on_failure=config.eval_harness_failure, failure_listener=record.eval_failed if record else None,
            )

    return add


#: The entry point's errors and their codes, after those of the training layer (training/errors.py has the table).
_EXIT_CODES = ((ConfigError, ExitCode.CONFIG_ERROR), (TaskSpecError, ExitCode.CONFIG_ERROR),
               (EvalDatasetError, ExitCode.EVAL_FAILED), *ERROR_EXIT_CODES)  # fmt: skip


def exit_code(error: BaseException) -> int:
    """The exit code of a run that ended with ``error``: a stop it decided, a person's interrupt, or a crash (1)."""
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return next((code for cls, code in _EXIT_CODES if isinstance(error, cls)), ExitCode.CRASH)


class _Interrupts:
    """Whether a person interrupted the program (SIGINT), even where the KeyboardInterrupt it raised reached us as
    another error (a library that wrapped it, or a thread that died of it)."""

    def __init__(self):
        self.seen = False

    def __call__(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    interrupts = _Interrupts()
    if threading.current_thread() is not threading.main_thread():  # only the main thread may handle signals
        return _run_cli(argv, interrupts)
    previous = signal.signal(signal.SIGINT, interrupts)
    try:
        return _run_cli(argv, interrupts)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_cli(argv: list[str], interrupts: _Interrupts) -> int:
    try:
        summary = main(parse_train_config(argv))
    except Exception as e:  # noqa: BLE001 - reported, then the exit code says which kind
        if interrupts.seen:
            return _interrupted()
        code = exit_code(e)
        if code == ExitCode.CRASH:
            if not distributed.is_multiprocess():
                raise
            logger.exception("Training failed")
        print(f"{'config error' if code == ExitCode.CONFIG_ERROR else 'error'}: {e}", file=sys.stderr)
        if distributed.is_multiprocess() or getattr(e, "leave_now", False):  # leave_now: a write is left running
            distributed.exit_now(code, together=getattr(e, "decided_together", False))
        return code
    except KeyboardInterrupt:  # a person's decision, not a crash: no traceback, and no launcher retries 130
        return _interrupted()
    if summary is not None:
        print(summary.describe())
    return ExitCode.DONE


def _interrupted() -> int:
    print("interrupted: the run stopped (its lease released); rerun the same command to resume", file=sys.stderr)
    if distributed.is_multiprocess():
        distributed.exit_now(ExitCode.INTERRUPTED)
    return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(cli())
