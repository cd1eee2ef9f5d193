"""Defect 18: the pinned Levanter starts ``jax.distributed`` with jax's default heartbeat;
``levanter_mars.compat.jax_distributed`` starts it with ours."""

import inspect

import jax

from levanter_mars.compat import jax_distributed


def test_defect_18_levanter_starts_jax_distributed_with_the_default_heartbeat():
    from levanter.distributed import DistributedConfig

    assert "heartbeat_timeout" not in inspect.getsource(DistributedConfig.initialize)
    default = inspect.signature(jax.distributed.initialize).parameters["heartbeat_timeout_seconds"].default
    assert default >= 100, "jax now notices a dead peer quickly by default: reconsider jax_distributed.start"


def test_defect_18_start_passes_our_timeouts_and_hands_levanter_a_started_config(monkeypatch):
    from levanter.distributed import DistributedConfig

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    config = DistributedConfig(coordinator_address="127.0.0.1:1", num_processes=2, process_id=1)
    started = jax_distributed.start(config, heartbeat_timeout_s=7, initialization_timeout_s=9)
    (args, kwargs), = calls
    assert args[:3] == ("127.0.0.1:1", 2, 1)
    assert kwargs == {"initialization_timeout": 9, "heartbeat_timeout_seconds": 7}
    assert started.initialize_jax_distributed is False and started.coordinator_address == "127.0.0.1:1"
    assert jax_distributed.start(DistributedConfig(), heartbeat_timeout_s=7, initialization_timeout_s=9) == DistributedConfig()
    assert len(calls) == 1
