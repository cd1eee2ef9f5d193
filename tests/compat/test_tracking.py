"""Defects of the pinned Levanter's trackers that ``levanter_mars.compat.tracking`` works around (defect 17,
wandb's own, is test_tracking_wandb_offline.py)."""

import pytest


def test_defect_9_default_tracker_is_online_wandb_and_ours_is_offline():
    from levanter.trainer import TrainerConfig
    from levanter.tracker.wandb import WandbConfig

    from levanter_mars.training.trainer import MarsTrainerConfig

    upstream_tracker = TrainerConfig().tracker
    assert isinstance(upstream_tracker, WandbConfig) and upstream_tracker.mode is None
    assert MarsTrainerConfig().tracker.mode == "offline"


def test_defect_29_levanter_gives_every_other_process_an_offline_wandb_run(monkeypatch):
    import levanter.tracker.wandb as levanter_wandb
    import wandb

    asked = []

    class Stop(Exception):
        pass

    def init(**kwargs):
        asked.append(kwargs["mode"])
        raise Stop  # what it asked for is all that matters

    monkeypatch.setattr(levanter_wandb.jax, "process_index", lambda: 1)
    monkeypatch.setattr(wandb, "init", init)
    with pytest.raises(Stop):
        levanter_wandb.WandbConfig(mode="disabled").init("run-1")
    assert asked == ["offline"], "process 1 writes an offline W&B run, whatever the config says"


def test_defect_29_workaround_leaves_wandb_to_process_zero(monkeypatch):
    from levanter.tracker.tracker import NoopConfig, NoopTracker
    from levanter.tracker.wandb import WandbConfig

    from levanter_mars.compat import tracking
    from levanter_mars.training.trainer import MarsTrainerConfig

    wandb_and_noop = MarsTrainerConfig(tracker=(WandbConfig(mode="offline"), NoopConfig()))
    single = MarsTrainerConfig(tracker=WandbConfig(mode="offline"))
    tracking.only_process_zero_tracks(single)  # process 0 (this test): unchanged
    assert isinstance(single.tracker, WandbConfig)

    monkeypatch.setattr(tracking.jax, "process_index", lambda: 1)
    joined = []
    monkeypatch.setattr(tracking.jax, "process_count", lambda: 2)
    monkeypatch.setattr(tracking, "multihost_broadcast_sync", lambda obj, is_source: joined.append(is_source) or {})
    tracking.only_process_zero_tracks(single)
    tracking.only_process_zero_tracks(wandb_and_noop)
    assert isinstance(single.tracker, tracking.WandbOnProcessZeroOnly)
    assert [type(t) for t in wandb_and_noop.tracker] == [tracking.WandbOnProcessZeroOnly, NoopConfig]
    assert isinstance(single.tracker.init("run-1"), NoopTracker)
    assert joined == [False], "process 1 must join process 0's broadcast of the run's W&B identity"
    import draccus

    assert draccus.encode(single)["tracker"] == {"type": "wandb_on_process_zero_only"}  # configs get encoded
