"""``python -m levanter_mars.main.train_lm --config_path config/<file>.yaml [--section.field value ...]``

The program's order, on one process or on every host of a pod alike: parse; start ``jax.distributed`` (nothing
touches a JAX backend before it); validate; prepare what is shared (corpus, token caches, set-asides, the resume
decision: process 0 acts, the others wait for its answer); build; train; summarize (process 0).
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

import levanter

import levanter_mars.optim.levanter_config  # noqa: F401  (registers the mars-* optimizer types)
from levanter_mars.compat.levanter_logging import log_file_named_by_run_id
from levanter_mars.compat.tracking import only_process_zero_tracks, wandb_offline_unless_configured
from levanter_mars.eval import in_training
from levanter_mars.eval.suite import EvalDatasetError, TaskSpecError
from levanter_mars.program_config import TrainAndEvalConfig, parse_train_config
from levanter_mars.training import distributed, validation
from levanter_mars.training.data import cache_check
from levanter_mars.training.data import sources as data
from levanter_mars.training.run import fresh
from levanter_mars.training.data import pydocs_corpus
from levanter_mars.training.errors import CheckpointError
from levanter_mars.training.config import ConfigError
from levanter_mars.training.errors import DataExhaustedError, NonFiniteTrainingError
from levanter_mars.training.run.identity import checkpoint_dir, describe_run, run_dir, stable_run_id
from levanter_mars.training.lm import train_lm
from levanter_mars.training.checkpointing.resume import plan_resume
from levanter_mars.training.run.summary import RunSummary, summarize

logger = logging.getLogger(__name__)


def main(config: TrainAndEvalConfig) -> Optional[RunSummary]:
    """Runs (or resumes) training. Raises ConfigError before any compilation if the config is bad. Returns the
    summary on process 0, None on the other hosts."""
    # Levanter turns on INFO for its own loggers only; ours report resumes and skipped checkpoints.
    package_logger = logging.getLogger("levanter_mars")
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO)

    distributed.start(config.trainer)
    config.trainer.id = stable_run_id(config)
    if config.embedded_corpus:
        distributed.leader_decides(lambda: bool(pydocs_corpus.prepare(config.embedded_corpus)))
    validation.validate(config)
    wandb_offline_unless_configured(config.trainer)
    only_process_zero_tracks(config.trainer)

    # Process 0 holds every token cache to its provenance record (a mismatch raises ConfigError on every host), moves
    # caches aside for data.rebuild_cache and records the caches about to be built.
    distributed.leader_decides(lambda: cache_check.check_and_prepare(config.data).to_json())
    distributed.leader_decides(lambda: data.build_local_caches(config.data))
    if config.fresh:
        distributed.leader_decides(lambda: fresh.set_aside_run(config))
    run_info = describe_run(config)
    resume = None
    if config.trainer.load_checkpoint is not False:
        resume = plan_resume(
            config.trainer.load_checkpoint_path or checkpoint_dir(config), run_info,
            verify_checksums=config.trainer.checkpointer.verify_checksums,
        )

    with log_file_named_by_run_id():
        levanter.initialize(config)
    train_lm(config, run_info=run_info, resume=resume, add_hooks=_eval_hooks(config))
    return summarize(config) if distributed.is_leader() else None


def _eval_hooks(config: TrainAndEvalConfig):
    def add(trainer, tokenizer) -> None:
        if config.eval_harness is not None:
            in_training.install(
                trainer, config.eval_harness, config.eval_harness_steps, tokenizer, run_dir=str(run_dir(config))
            )

    return add


#: Exit codes: 2 for a bad config (nothing ran), 1 for a run that stopped with a reason it reports.
_EXIT_CODES = (
    (ConfigError, 2), (TaskSpecError, 2),
    (CheckpointError, 1), (NonFiniteTrainingError, 1), (DataExhaustedError, 1), (EvalDatasetError, 1),
)  # fmt: skip


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        summary = main(parse_train_config(argv))
    except Exception as e:  # noqa: BLE001 - reported, then the exit code says which kind
        code = next((c for cls, c in _EXIT_CODES if isinstance(e, cls)), None)
        if code is None:
            if not distributed.is_multiprocess():
                raise
            logger.exception("Training failed")
            code = 1
        print(f"{'config error' if code == 2 else 'error'}: {e}", file=sys.stderr)
        if distributed.is_multiprocess():
            distributed.exit_now(code)
        return code
    if summary is not None:
        print(summary.describe())
    return 0


if __name__ == "__main__":
    sys.exit(cli())
