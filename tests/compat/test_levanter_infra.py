"""Defect 14 of the pinned Levanter's TPU infrastructure, which ``levanter_mars.compat.levanter_infra`` works
around."""

import inspect

import pytest

from levanter_mars.compat import levanter_infra


def test_defect_14_preemption_probe_needs_the_gce_metadata_server(monkeypatch):
    import levanter.infra.ray_tpu as ray_tpu
    import levanter.infra.tpus as tpus
    import requests

    def no_metadata_server(*args, **kwargs):
        raise requests.ConnectionError("no metadata.google.internal off GCE")

    monkeypatch.setattr(tpus.requests, "get", no_metadata_server)
    monkeypatch.setattr(tpus, "get_current_tpu_is_preempted", tpus.get_current_tpu_is_preempted)  # restored after
    with pytest.raises(requests.ConnectionError):
        tpus.get_current_tpu_is_preempted()
    # run_on_pod's slice and host health checks call it.
    assert inspect.getsource(ray_tpu).count("get_current_tpu_is_preempted()") >= 3

    levanter_infra.preemption_probe_off_gce()
    assert tpus.get_current_tpu_is_preempted() is False


def test_defect_45_run_on_pod_waits_a_week_for_missing_slices_and_scales_up_only_after_12_hours(monkeypatch):
    """Levanter's limping: the largest count's slices are awaited for a week before fewer are taken, a scale-up is
    tried no sooner than 12 hours (not configurable), and a preemption past its budget is only a message. The
    workaround runs one count per attempt, raising SlicesPreempted on exactly that message."""
    import levanter.infra.ray_tpu as ray_tpu

    assert ray_tpu._START_ACTOR_TIMEOUT >= 24 * 3600  # the wait for slices that are not up
    assert ray_tpu._SCALE_UP_MULTISLICE_INTERVAL == 12 * 3600
    source = inspect.getsource(ray_tpu.SlicePoolManager.check_should_scale_up_multislice)
    assert "_add_members_to_actor_pool(next_larger_size)" in source  # which waits _START_ACTOR_TIMEOUT
    assert levanter_infra.PREEMPTED_MESSAGE in inspect.getsource(ray_tpu)
    from ray.exceptions import OwnerDiedError

    lost_with_its_slice = OwnerDiedError("c3f2", None, "")  # what reading a lost host's task result raises
    assert isinstance(ray_tpu._handle_ray_error(lost_with_its_slice), ray_tpu.TpuRunError)  # a failure, not preempted

    asked = {}

    def preempted(remote_fn, tpu_type, **kwargs):
        asked.update(kwargs)
        raise RuntimeError(levanter_infra.PREEMPTED_MESSAGE)

    monkeypatch.setattr(ray_tpu, "run_on_pod", preempted)
    with pytest.raises(levanter_infra.SlicesPreempted):
        levanter_infra.run_on_slices(object(), "v4-8", 2)
    assert asked == {"num_slices": 2, "max_retries_preemption": 0, "max_retries_failure": 0}

    def lost(remote_fn, tpu_type, **kwargs):
        raise lost_with_its_slice

    monkeypatch.setattr(ray_tpu, "run_on_pod", lost)
    with pytest.raises(levanter_infra.SlicesPreempted):
        levanter_infra.run_on_slices(object(), "v4-8", 2)

    def failed(remote_fn, tpu_type, **kwargs):
        raise RuntimeError("Task was cancelled")

    monkeypatch.setattr(ray_tpu, "run_on_pod", failed)
    with pytest.raises(RuntimeError, match="cancelled") as raised:
        levanter_infra.run_on_slices(object(), "v4-8", 1)
    assert not isinstance(raised.value, levanter_infra.SlicesPreempted)
