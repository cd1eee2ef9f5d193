"""A pod's start: every host joins ``jax.distributed``, then they all meet in one first collective.

Its own module because it orders two concerns: the compilation cache goes off on an XLA:CPU pod before the first
collective program compiles (``compilation_cache.loads_can_deadlock``), and the cache itself asks
``distributed.is_multiprocess``; kept in either of those two modules, the two would import each other.
"""

from __future__ import annotations

from levanter_mars.compat import jax_distributed
from levanter_mars.training import compilation_cache, distributed

#: A host whose peer stops sending heartbeats ends itself after this long (jax's default is 100 s). Heartbeats come
#: from a C++ thread, so a long compilation or a slow step does not miss them.
HEARTBEAT_TIMEOUT_S = 20
#: How long a host waits for the others to join at start: slow-starting pods need minutes.
INITIALIZATION_TIMEOUT_S = 600


def start(trainer_config) -> None:
    """Starts ``jax.distributed`` when flags or a TPU pod ask for it. Must run before anything touches JAX."""
    trainer_config.distributed = jax_distributed.start(
        trainer_config.distributed,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        initialization_timeout_s=INITIALIZATION_TIMEOUT_S,
    )
    if distributed.is_multiprocess():
        from jax.experimental import multihost_utils

        if compilation_cache.loads_can_deadlock():
            compilation_cache.turn_off()  # before the first collective program (below): see loads_can_deadlock

        # The first collective over all devices sets up their communicator, and on CPU (gloo) every host must reach
        # it within 30 s of the others. Here they all just left jax.distributed's start-up barrier; the first
        # training step comes after a compilation whose length differs from host to host.
        multihost_utils.sync_global_devices("levanter_mars: every host is up")
