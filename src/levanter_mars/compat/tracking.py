"""W&B: offline unless configured (defects 9 and 17), and written by process 0 only (defect 29)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import jax
from levanter.tracker.tracker import NoopConfig, NoopTracker, TrackerConfig
from levanter.utils.jax_utils import multihost_broadcast_sync

logger = logging.getLogger(__name__)


def wandb_offline_unless_configured(trainer_config) -> None:
    """W&B is online only when configured to be: an explicit ``mode``, ``WANDB_MODE``, or an API key. Otherwise a
    wandb tracker would fail without credentials (defect 9), so it logs offline and says so."""
    from levanter.tracker.wandb import WandbConfig

    tracker_config = trainer_config.tracker
    trackers = tracker_config if isinstance(tracker_config, tuple) else (tracker_config,)
    configured = os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY")
    for tracker in trackers:
        if isinstance(tracker, WandbConfig) and tracker.mode is None and not configured:
            tracker.mode = "offline"
            logger.warning("No WANDB_API_KEY or WANDB_MODE: logging to W&B offline (sync later with `wandb sync`).")
        offline = isinstance(tracker, WandbConfig) and tracker.mode in ("offline", "disabled")
        if offline and "WANDB_MODE" not in os.environ:
            # Defect 17: wandb-core resolves its API host at shutdown when the mode comes only from
            # wandb.init(mode="offline"); with WANDB_MODE in its environment it stays off the network.
            os.environ["WANDB_MODE"] = tracker.mode


def only_process_zero_tracks(trainer_config) -> None:
    """Defect 29: Levanter's ``WandbConfig.init`` hard-codes ``mode="offline"`` on every process but 0 (its own
    comment says they should be disabled), so each host of a pod writes a whole offline W&B run. On the other
    processes each W&B tracker is replaced by one that records nothing but still joins the broadcast that
    ``WandbConfig.init`` makes on every process (its barrier would wait for them, and the broadcasts are numbered)."""
    from levanter.tracker.wandb import WandbConfig

    if jax.process_index() == 0:
        return
    tracker_config = trainer_config.tracker
    if isinstance(tracker_config, tuple):
        trainer_config.tracker = tuple(_not_on_this_process(t, WandbConfig) for t in tracker_config)
    else:
        trainer_config.tracker = _not_on_this_process(tracker_config, WandbConfig)


def _not_on_this_process(tracker, wandb_config_class):
    return WandbOnProcessZeroOnly() if isinstance(tracker, wandb_config_class) else tracker


@TrackerConfig.register_subclass("wandb_on_process_zero_only")
@dataclass
class WandbOnProcessZeroOnly(NoopConfig):
    """A W&B tracker on a process other than 0: records nothing, joins process 0's run-info broadcast."""

    def init(self, run_id):
        if jax.process_count() > 1:
            multihost_broadcast_sync({}, is_source=False)
        return NoopTracker()
