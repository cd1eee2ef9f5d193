"""Every check on a training config, in one place, run before anything is compiled.

Each problem is reported as a :class:`ConfigError` naming the field (``optimizer.beta1``, ``data.train_urls[0]``,
``trainer.train_batch_size``) and what is allowed. Field-level checks of the MARS configs live in their
``__post_init__`` (so they also fire when a config is built in Python); this module adds the checks that need the
whole config, the file system or the devices; the optimizer's own, built, are :mod:`.optimizer_validation`'s.
"""

from __future__ import annotations

import os

import jax

from levanter_mars.training.checkpointing.storage import check_writable
from levanter_mars.training.config import ConfigError, TrainLmConfig
from levanter_mars.training.data.checks import check_data
from levanter_mars.training.errors import EVAL_FAILURE_POLICIES
from levanter_mars.training import distributed
from levanter_mars.training.nonfinite import NONFINITE_POLICIES
from levanter_mars.training.optimizer_validation import check_optimizer, is_number


def check_trainer(trainer) -> None:
    if trainer.nonfinite not in NONFINITE_POLICIES:
        raise ConfigError(f"trainer.nonfinite must be one of {NONFINITE_POLICIES}, got {trainer.nonfinite!r}")
    if trainer.max_consecutive_nonfinite < 1:
        raise ConfigError(f"trainer.max_consecutive_nonfinite must be >= 1, got {trainer.max_consecutive_nonfinite}")
    grace = trainer.preemption_grace_s
    if not is_number(grace) or not 0 < grace < float("inf"):
        raise ConfigError(f"trainer.preemption_grace_s must be a number of seconds > 0, got {grace!r}")
    if trainer.num_train_steps < 1:
        raise ConfigError(f"trainer.num_train_steps must be >= 1, got {trainer.num_train_steps}")
    if trainer.steps_per_eval < 1:
        raise ConfigError(f"trainer.steps_per_eval must be >= 1, got {trainer.steps_per_eval}")
    if isinstance(trainer.train_batch_size, int) and trainer.train_batch_size < 1 and trainer.train_batch_size != -1:
        raise ConfigError(f"trainer.train_batch_size must be >= 1, got {trainer.train_batch_size}")
    keep = trainer.checkpointer.keep
    for i, policy in enumerate(keep if isinstance(keep, (list, tuple)) else [keep]):
        where = f"trainer.checkpointer.keep[{i}]"
        if not isinstance(policy, dict) or "every" not in policy or not set(policy) <= {"every", "until"}:
            raise ConfigError(
                f"{where} must be a mapping {{every: <steps>, until: <step or null>}} (YAML flow style needs a "
                f"space after the colon: '[{{every: 1000}}]'), got {policy!r}"
            )
        for key in ("every", "until"):
            value = policy.get(key)
            if key == "until" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{where}.{key} must be a whole number of steps >= 1, got {value!r}")
    if trainer.model_axis_size < 1:
        raise ConfigError(f"trainer.model_axis_size must be >= 1, got {trainer.model_axis_size}")


def check_mesh(trainer, device_count: int | None = None) -> None:
    """The mesh and batch arithmetic Levanter would otherwise fail on mid-initialization (or inside jit).

    Runs after ``jax.distributed`` starts, so on a pod the device count is the whole slice's.
    """
    if device_count is None:
        device_count = jax.device_count()
    model, replica = trainer.model_axis_size, trainer.replica_ici_axis_size
    if device_count % (model * replica) != 0:
        raise ConfigError(
            f"trainer.model_axis_size={model} x trainer.replica_ici_axis_size={replica} does not divide the "
            f"{device_count} available devices: no such mesh"
        )
    data_axis = device_count // model
    batch, per_device = trainer.train_batch_size, trainer.per_device_parallelism
    if isinstance(batch, int) and batch > 0:
        if batch % data_axis != 0:
            raise ConfigError(
                f"trainer.train_batch_size={batch} is not divisible by the data-parallel size {data_axis} "
                f"({device_count} devices / model_axis_size {model})"
            )
        if per_device > 0 and batch % (per_device * data_axis) != 0:
            raise ConfigError(
                f"trainer.train_batch_size={batch} is not divisible by trainer.per_device_parallelism={per_device} x "
                f"data-parallel size {data_axis}"
            )


#: Model types Levanter registers that this language-model trainer cannot train, and why.
UNTRAINABLE_MODEL_TYPES = {"whisper": "an audio encoder-decoder, not a causal language model"}


def model_type_name(model) -> str:
    from levanter.models.lm_model import LmConfig

    return LmConfig.get_choice_name(type(model)) or type(model).__name__


def check_model(model) -> None:
    name = model_type_name(model)
    if name in UNTRAINABLE_MODEL_TYPES:
        raise ConfigError(f"model.type={name} is not supported by levanter_mars: {UNTRAINABLE_MODEL_TYPES[name]}")
    hidden, heads = getattr(model, "hidden_dim", None), getattr(model, "num_heads", None)
    if is_number(hidden) and is_number(heads) and (heads < 1 or hidden % heads != 0):
        raise ConfigError(f"model.hidden_dim={hidden} must be a multiple of model.num_heads={heads}")
    for name in ("seq_len", "num_layers", "hidden_dim"):
        value = getattr(model, name, None)
        if is_number(value) and value < 1:
            raise ConfigError(f"model.{name} must be >= 1, got {value}")


PLACEHOLDER = "YOUR-BUCKET"


def check_placeholders(config: TrainLmConfig) -> None:
    """The shipped TPU configs point at gs://YOUR-BUCKET/...: refuse to run until that is replaced."""
    fields = {
        "data.cache_dir": getattr(config.data, "cache_dir", None),
        "trainer.checkpointer.base_path": config.trainer.checkpointer.base_path,
        "trainer.load_checkpoint_path": config.trainer.load_checkpoint_path,
        "hf_save_path": config.hf_save_path,
    }
    for name, value in fields.items():
        if isinstance(value, str) and PLACEHOLDER in value:
            raise ConfigError(f"{name} is still the placeholder {value!r}: set it to your bucket or a local path")


def check_storage(config: TrainLmConfig, *, offline: bool = False, probe_writes: bool = True) -> list[str]:
    """Where the run writes: the checkpoint directory, the HF exports and the compilation cache. Process 0 probes them
    (shared storage); every process gets its verdict. Returns the probes skipped (``offline``: bucket paths; without
    ``probe_writes``: all of them)."""
    from levanter_mars.training.compilation_cache import resolve

    checkpoints = config.trainer.checkpointer.expanded_path(config.trainer.id or "run")
    targets = [("trainer.checkpointer.base_path", checkpoints, "checkpoints")]
    if getattr(config, "hf_save_path", None) is not None and getattr(config, "hf_save_steps", None) is not None:
        targets.append(("hf_save_path", config.hf_save_path, "HF exports"))
    cache = resolve(config.trainer)
    if cache.path is not None:
        targets.append((cache.source, cache.path, "compiled programs"))
    skipped = [f"{field} {path!r} (a write probe)" for field, path, _ in targets
               if not probe_writes or (offline and "://" in str(path))]  # fmt: skip
    probed = [t for t in targets if probe_writes and not (offline and "://" in str(t[1]))]

    def probe() -> None:
        # A failed probe is unusable storage (exit 5), not a bad config: the same probe fails on a full disk and on a
        # passing failure of the storage service at an attempt's start, which a launcher retries (a bounded number
        # of times; training/outcome.py).
        for field, path, what in probed:
            check_writable(str(path), field=field, what=what)

    if probed:
        distributed.leader_decides(probe)
    return skipped


#: Fields of Levanter's TrainLmConfig that this entry point does not implement.
UNSUPPORTED = {
    "initialize_from_hf": "start from a Levanter checkpoint with initialize_from_checkpoint_path instead",
    "use_hf_model_config": "set the model fields in the YAML",
    "log_entropy": "not implemented by levanter_mars",
}


def check_supported(config: TrainLmConfig) -> None:
    policy = getattr(config, "eval_harness_failure", EVAL_FAILURE_POLICIES[0])
    if policy not in EVAL_FAILURE_POLICIES:
        raise ConfigError(f"eval_harness_failure must be one of {EVAL_FAILURE_POLICIES}, got {policy!r}")
    for name, instead in UNSUPPORTED.items():
        if getattr(config, name, False):
            raise ConfigError(f"{name} is not supported by levanter_mars.main.train_lm: {instead}")
    if config.hf_save_path is not None:
        from levanter_mars.compat.levanter_models import hf_export_refusal

        why = hf_export_refusal(config.model)
        if why is not None:
            raise ConfigError(
                f"hf_save_path is set, but model.type={model_type_name(config.model)} cannot be exported to HF "
                f"offline: {why}. Unset hf_save_path (Levanter checkpoints are still written)"
            )


def check_embedded_corpus(config: TrainLmConfig) -> None:
    from levanter_mars.training.data.pydocs_corpus import check_sources

    try:
        check_sources(getattr(config, "embedded_corpus_sources", "stdlib"))
    except ValueError as e:
        raise ConfigError(str(e)) from e


def check_fields(config: TrainLmConfig, *, placeholders: bool = True) -> None:
    """What the config alone decides, cheapest first. ``placeholders``: False where nothing will be read or written
    (pre-flight sizes the program of a shipped config before its bucket is filled in)."""
    if placeholders:
        check_placeholders(config)
    check_supported(config)
    check_embedded_corpus(config)
    check_trainer(config.trainer)
    check_model(config.model)
    check_optimizer(config.optimizer, config.trainer.num_train_steps)


def check_surroundings(
    config: TrainLmConfig, *, device_count: int | None = None, offline: bool = False, probe_writes: bool = True,
    elsewhere: bool = False,
) -> list[str]:
    """What the config asks of the devices, the data and the storage. Returns the checks skipped. ``elsewhere``: the
    check is made for a run on other machines (the launcher, pre-flight)."""
    check_mesh(config.trainer, device_count)
    corpus = getattr(config, "embedded_corpus", None)
    unbuilt = corpus if corpus and not os.path.exists(os.path.join(corpus, "corpus.json")) else None
    skipped = check_data(config.data, offline=offline, built_by_the_run=unbuilt, elsewhere=elsewhere)
    return skipped + check_storage(config, offline=offline, probe_writes=probe_writes)


def validate(
    config: TrainLmConfig, *, device_count: int | None = None, offline: bool = False, probe_writes: bool = True,
    elsewhere: bool = False, placeholders: bool = True,
) -> list[str]:
    """All checks, wherever a config is checked: training, the launcher, pre-flight. Raises :class:`ConfigError`.
    ``offline``: skip what needs the network (pre-flight, a dry run); ``probe_writes``: False to write nothing (a dry
    run); ``elsewhere``: checked for a run on other machines. Returns the checks skipped, for the caller to say so."""
    check_fields(config, placeholders=placeholders)
    return check_surroundings(config, device_count=device_count, offline=offline, probe_writes=probe_writes,
                              elsewhere=elsewhere)  # fmt: skip
