"""The train step that training runs, built on a TPU slice's abstract devices and compiled by the TPU compiler.

Nothing is allocated: the state and the batch are shapes with the shardings the trainer gives them. The trainer is
the one ``training/lm.py`` builds (model, mixed precision, gradient checkpointing, loss, the config's optimizer with
its non-finite guard, exact MARS's second gradient, microbatching); only its mesh is the slice's, and its side
effects (tracker, checkpoint and log directories) are pointed at a scratch directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Optional

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import jax.random as jrandom
import levanter
import numpy as np
from haliax.partitioning import ResourceAxis, infer_resource_partitions
from jax.experimental import mesh_utils
from jax.sharding import Mesh
from levanter.models.lm_model import LmExample
from levanter.tracker import NoopConfig

from levanter_mars.compat.levanter_training import jitted_train_step
from levanter_mars.training.config import ConfigError
from levanter_mars.training.lm import build_trainer, vocab_axis
from levanter_mars.training.trainer import MarsTrainerConfig


@dataclass
class SliceTrainerConfig(MarsTrainerConfig):
    """The trainer config on given devices (a TPU topology's), instead of the ones ``jax.devices()`` lists."""

    def on(self, devices: list, num_slices: int) -> "SliceTrainerConfig":
        self._devices, self._slices = devices, num_slices
        return self

    @property
    def num_slices(self) -> int:  # type: ignore[override]
        return self._slices

    @property
    def num_devices_per_slice(self) -> int:
        return len(self._devices) // self._slices

    @property
    def device_mesh(self) -> Mesh:
        ici = (self.replica_ici_axis_size, self.data_ici_axis_size, self.model_axis_size)
        if self._slices > 1:
            dcn = (self.replica_dcn_axis_size, self.data_dcn_axis_size, 1)
            grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, self._devices, allow_split_physical_axes=True)
        else:
            grid = mesh_utils.create_device_mesh(ici, self._devices, allow_split_physical_axes=True)
        return Mesh(grid, (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL))


def _on_slice(trainer: MarsTrainerConfig, devices: list, num_slices: int, scratch: str) -> SliceTrainerConfig:
    values = {f.name: getattr(trainer, f.name) for f in dataclasses.fields(trainer) if f.init}
    values.update(
        tracker=NoopConfig(), log_dir=scratch, load_checkpoint=False, id=trainer.id or "preflight",
        checkpointer=dataclasses.replace(trainer.checkpointer, base_path=scratch),
    )
    config = SliceTrainerConfig(**values).on(devices, num_slices)
    # What TrainerConfig.initialize resolves from the device count (it also starts logging and trackers).
    if config.replica_dcn_axis_size == -1:
        config.replica_dcn_axis_size = num_slices
    if num_slices % config.replica_dcn_axis_size:
        raise ConfigError(
            f"trainer.replica_dcn_axis_size={config.replica_dcn_axis_size} must divide --num_slices={num_slices}"
        )
    if config.per_device_parallelism == -1:
        config.per_device_parallelism = config.train_batch_size // config.data_axis_size
    if config.per_device_eval_parallelism == -1:
        config.per_device_eval_parallelism = config.per_device_parallelism
    return config


@dataclass(frozen=True)
class Compiled:
    """One compile's figures, per device (one device is one chip, see ``topology.py``). When the compiler refuses
    the program, there is no memory analysis: the sizes are ``None`` and its verdict is kept."""

    argument_bytes: Optional[int]
    output_bytes: Optional[int]
    alias_bytes: Optional[int]
    temp_bytes: Optional[int]
    flops: Optional[float]
    compile_seconds: float
    out_of_memory: Optional[str] = None
    """The TPU compiler's refusal, first line, when the program does not fit."""
    used_bytes: Optional[int] = None
    """With ``out_of_memory``: the compiler's figure for what it could not place, ``used_counts``."""
    used_counts: Optional[str] = None
    capacity_bytes: Optional[int] = None
    """With ``out_of_memory``: the HBM the compiler says one device has for it."""
    load_average: Optional[float] = None
    """This machine's 1-minute load average when the compile ended (compile times mean little without it)."""

    @property
    def total_bytes(self) -> Optional[int]:
        """The whole program: arguments + outputs - donated + temporaries from the memory analysis, or the refusal's
        figure where it counts the whole program; ``None`` where the refusal counts a part (``partial``)."""
        if self.out_of_memory is None:
            return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
        return self.used_bytes if self.used_counts == WHOLE_PROGRAM else None

    @property
    def partial(self) -> Optional[dict]:
        """A refusal's figure for part of the program (``counts`` says which part): not comparable to a total."""
        if self.out_of_memory is None or self.used_counts == WHOLE_PROGRAM:
            return None
        return {"bytes": self.used_bytes, "counts": self.used_counts}


# The TPU compiler's ways of saying a program does not fit, and what each figure counts: the whole program's peak
# (libtpu 0.0.37); its temporaries alone, estimated before it places the program (0.0.42, in seconds rather than
# minutes, and not a bound of the peak: 56.39 GiB where 0.0.37 said 49.09 for the whole of the same program); or one
# buffer alone that is too large.
WHOLE_PROGRAM, TEMPORARIES, ONE_BUFFER = "the whole program", "its temporaries alone", "one buffer alone"
_VERDICTS = (
    (WHOLE_PROGRAM, re.compile(r"Used ([0-9.]+)([KMGT]) of ([0-9.]+)([KMGT]) hbm")),
    (TEMPORARIES, re.compile(
        r"required for HLO temporaries \(([0-9.]+)([KMGT])\) exceeds available HBM \(([0-9.]+)([KMGT])\)")),
    (ONE_BUFFER, re.compile(r"Allocation \(size=(\d+)()\) would exceed memory \(size=(\d+)()\)")),
)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "": 1}


class OutOfMemory(NamedTuple):
    needed: int
    """Bytes per device, of what ``counts``."""
    capacity: int
    """The HBM the compiler says one device has for it."""
    line: str
    counts: str


def out_of_memory(message: str) -> Optional[OutOfMemory]:
    """The compiler's out-of-memory verdict in ``message``, if it is one."""
    if "RESOURCE_EXHAUSTED" not in message:
        return None
    line = next((ln.strip() for ln in message.splitlines() if "hbm" in ln.lower() or "would exceed memory" in ln), "")
    line = line[line.find("RESOURCE_EXHAUSTED"):] if "RESOURCE_EXHAUSTED" in line else line
    for counts, pattern in _VERDICTS:
        found = pattern.search(message)
        if found:
            needed, unit, capacity, capacity_unit = found.groups()
            return OutOfMemory(int(float(needed) * _UNITS[unit]), int(float(capacity) * _UNITS[capacity_unit]), line,
                               counts)
    return None


def compile_program(lowered: Any) -> Compiled:
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - only the compiler's out-of-memory verdict is an answer; the rest raise
        verdict = out_of_memory(str(e))
        if verdict is None:
            raise
        return Compiled(None, None, None, None, None, time.perf_counter() - start, out_of_memory=verdict.line,
                        used_bytes=verdict.needed, used_counts=verdict.counts, capacity_bytes=verdict.capacity,
                        load_average=round(os.getloadavg()[0], 1))
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return Compiled(
        argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes), temp_bytes=int(memory.temp_size_in_bytes),
        flops=float(cost["flops"]) if cost and "flops" in cost else None, compile_seconds=seconds,
        load_average=round(os.getloadavg()[0], 1),
    )


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded shapes."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize
    return total


@dataclass
class TrainStep:
    """The abstract state and batch of one training step on the slice, and its lowered program."""

    trainer_config: SliceTrainerConfig
    state: Any
    batch: Any
    lowered: Any
    trainer: Any
    """The trainer that made the step (its mesh and axis mappings serve the eval programs)."""

    @property
    def mesh(self) -> Mesh:
        return self.trainer.device_mesh

    @property
    def parameter_bytes(self) -> int:
        return shard_bytes(self.state.model)

    @property
    def optimizer_state_bytes(self) -> int:
        return shard_bytes(self.state.opt_state)


def with_shardings(shapes: Any, mapping, mesh: Mesh) -> Any:
    shardings = infer_resource_partitions(shapes, mapping, preserve_existing_shardings=False, mesh=mesh)

    def attach(shape, sharding):
        if isinstance(shape, hax.NamedArray):
            return hax.NamedArray(attach(shape.array, sharding), shape.axes)
        if not isinstance(shape, jax.ShapeDtypeStruct):
            return shape  # static leaves (the trainable-parameter mask)
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding)

    return jax.tree_util.tree_map(attach, shapes, shardings, is_leaf=lambda x: isinstance(x, hax.NamedArray))


def causal_examples(Batch: hax.Axis, Pos: hax.Axis, eos_id: Optional[int]):
    """tokens (Batch x Pos, int32) -> the causal LM examples the data loader gives the step."""

    def examples(tokens):
        return hax.vmap(lambda t: LmExample.causal(t, eos_id=eos_id), Batch)(hax.named(tokens, (Batch, Pos)))

    return examples


@contextlib.contextmanager
def on_mesh(step_or_trainer) -> Iterator[None]:
    """What ``with trainer:`` sets, except that the mesh is the legacy ``with mesh:`` context: the trainer's
    (jax.set_mesh) would send every eager op, haliax's own probes included, to the abstract TPU devices."""
    trainer = getattr(step_or_trainer, "trainer", step_or_trainer)
    with levanter.current_tracker(trainer.tracker), trainer.device_mesh, hax.axis_mapping(
        trainer.parameter_axis_mapping
    ):
        yield


def lower_train_step(config, devices: list, num_slices: int, vocab_size: int, eos_id: Optional[int]) -> TrainStep:
    """Lowers the training program of ``config`` (a TrainLmConfig) for ``devices``; raises ConfigError naming the
    field when the batch cannot be laid out on them."""
    with tempfile.TemporaryDirectory(prefix="preflight-") as scratch:
        trainer_config = _on_slice(config.trainer, devices, num_slices, scratch)
        config = dataclasses.replace(config, trainer=trainer_config)
        trainer = build_trainer(config, run_info={}, resume=None)
        trainer.metrics = None  # nothing is logged; its truncation on resume needs a concrete step
        mesh = trainer.device_mesh
        mapping = trainer.parameter_axis_mapping
        with on_mesh(trainer):
            Vocab = vocab_axis(vocab_size, trainer)
            _data_key, _loader_key, model_key, training_key = jrandom.split(jrandom.PRNGKey(trainer_config.seed), 4)

            def init():
                return trainer.initial_state(training_key, model_init=lambda: config.model.build(Vocab, key=model_key))

            state = with_shardings(eqx.filter_eval_shape(init), mapping, mesh)
            Batch, Pos = trainer_config.TrainBatch, config.model.Pos

            tokens = jax.ShapeDtypeStruct((Batch.size, Pos.size), jnp.int32)
            batch = with_shardings(eqx.filter_eval_shape(causal_examples(Batch, Pos, eos_id), tokens),
                                   trainer.compute_axis_mapping, mesh)
            step = jitted_train_step(trainer)
            lowered = jax.jit(lambda s, b: step(s, (b,), {}), donate_argnums=0).lower(state, batch)
    return TrainStep(trainer_config, state, batch, lowered, trainer)
