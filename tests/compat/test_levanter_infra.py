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
