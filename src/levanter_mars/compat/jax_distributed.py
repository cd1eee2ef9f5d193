"""Defect 18: ``jax.distributed`` with timeouts a pod can live with.

Levanter's ``DistributedConfig.initialize`` starts ``jax.distributed`` with jax's 100 s heartbeat timeout and no
way to change it; a host then outlives a dead peer by minutes, blocked in a collective, and the launcher's retry
waits for it. :func:`start` does what Levanter's does (same auto-detection of TPU pods and SLURM) with our timeouts,
then marks the config so that ``levanter.initialize`` does not start it a second time.
"""

from __future__ import annotations

import dataclasses
import logging

import jax

logger = logging.getLogger(__name__)


def is_distributed(distributed_config) -> bool:
    """Whether flags or the environment (TPU pod, SLURM) ask for more than one process."""
    return distributed_config.initialize_jax_distributed and distributed_config._is_distributed()


def start(distributed_config, *, heartbeat_timeout_s: int, initialization_timeout_s: int):
    """Starts ``jax.distributed`` if the config or the environment asks for it. Touches no JAX backend before.

    Returns the config to hand to Levanter: the same one, with ``initialize_jax_distributed=False`` once started.
    """
    if not is_distributed(distributed_config):
        return distributed_config
    from levanter.distributed import LevanterSlurmCluster

    device_ids = distributed_config.local_device_ids
    coordinator = distributed_config.coordinator_address
    num_processes = distributed_config.num_processes
    if LevanterSlurmCluster.is_env_present():
        device_ids = device_ids if device_ids is not None else LevanterSlurmCluster.get_local_device_ids_for_process()
        coordinator = coordinator or LevanterSlurmCluster.get_coordinator_address(300.0)
        num_processes = num_processes if num_processes is not None else LevanterSlurmCluster.get_process_count()
    jax.distributed.initialize(
        coordinator,
        num_processes,
        distributed_config.process_id,
        device_ids,
        initialization_timeout=initialization_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    logger.info(
        "jax.distributed: process %d of %d, %d devices (%d local), heartbeat timeout %d s",
        jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count(), heartbeat_timeout_s,
    )
    return dataclasses.replace(distributed_config, initialize_jax_distributed=False)
