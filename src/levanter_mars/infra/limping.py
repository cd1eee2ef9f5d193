"""Planning a run that may limp: ``--num_slices 2,1`` allows each count, and every attempt must train the same way.

The global batch stays what the config says on every count. What changes is how it is cut: on fewer slices each
device would hold more examples at once, so the examples per device and microbatch are pinned to the largest count's
(``trainer.per_device_parallelism``, unless the config sets it), and a smaller count takes more microbatches per
step. A count whose devices cannot cut the batch that way is refused here, before any host starts; pre-flight then
compiles the step for every count (``preflight/launch_check.py``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from levanter_mars.infra.config import LaunchError
from levanter_mars.infra.slices import MeshPlan, plan_mesh

PER_DEVICE_FLAG = "--trainer.per_device_parallelism"


def pinned_microbatch(trainer, devices_per_slice: int, counts: Sequence[int]) -> tuple[str, ...]:
    """The training override that keeps each device's examples per microbatch at the largest count's, for a run that
    may limp; none for one count, or where the config pins it itself."""
    if len(counts) == 1 or trainer.per_device_parallelism > 0:
        return ()
    largest = plan_mesh(trainer, devices_per_slice, counts[0])
    if largest.examples_per_device_step is None:
        return ()  # a batch schedule: Levanter cuts each stage itself; plan_meshes checks what it can
    return (PER_DEVICE_FLAG, str(largest.examples_per_device_step))


def plan_meshes(trainer, devices_per_slice: int, counts: Sequence[int]) -> dict[int, MeshPlan]:
    """The mesh of each allowed count, largest first. Raises LaunchError naming ``--num_slices`` for a count whose
    devices cannot cut the global batch into whole microbatches."""
    meshes = {count: plan_mesh(trainer, devices_per_slice, count) for count in counts}
    if len(counts) == 1:
        return meshes  # the one count's batch is checked where any run's is (training/validation.py)
    for count, mesh in meshes.items():
        if mesh.batch_size is not None and mesh.examples_per_device_step and mesh.microbatches is None:
            batch_devices = mesh.axes["replica"] * mesh.axes["data"]
            raise LaunchError(
                f"--num_slices {','.join(map(str, counts))}: on {count} slice(s) the global batch of "
                f"{mesh.batch_size} examples does not split into microbatches of {mesh.examples_per_device_step} "
                f"example(s) on each of {batch_devices} devices; allow only counts that divide it, or change "
                "trainer.train_batch_size"
            )
    return meshes


def describe(meshes: Mapping[int, MeshPlan], scale_up_wait_s: float) -> dict[str, Any]:
    """The dry run's view of a run that may limp: the mesh and microbatches of each count."""
    return {
        "allowed_slice_counts": list(meshes),
        "scale_up_wait_s": scale_up_wait_s,
        "per_count": {
            count: {"mesh": mesh.one_line(), "microbatches_per_step": mesh.microbatches}
            for count, mesh in meshes.items()
        },
    }
