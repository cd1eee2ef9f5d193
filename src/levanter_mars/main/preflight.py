"""``python -m levanter_mars.main.preflight --config_path X --tpu_type T [--num_slices N] [--json] [-- overrides]``

Compiles the config's train step with the TPU compiler for the slice's topology, on this machine (no TPU, no
network), and says whether it fits the HBM the compiler lets a program use on each chip. Exit 0: it fits. Exit 2: it
does not (the message names what to change), or the config is bad (the training program's own validation, offline),
or there is no TPU compiler here. Exit 1: pre-flight itself crashed (a traceback). With ``--json`` the last stdout
line is one JSON
object (sizes in bytes). The order: parse and check the config and the slice, build the trainer's step on the
slice's abstract devices, compile, report.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

# The TPU compiler is driven from a CPU-only process: JAX itself must not look for accelerators.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import levanter_mars.optim.levanter_config  # noqa: E402, F401  (registers the mars-* optimizer types)
from levanter_mars.infra.config import LaunchError, canonical_tpu_type  # noqa: E402
from levanter_mars.infra.preflight.report import Verdict, json_line  # noqa: E402
from levanter_mars.infra.preflight.topology import PreflightError, abstract_devices, tpu_target  # noqa: E402
from levanter_mars.infra.slices import slice_type  # noqa: E402
from levanter_mars.training.config import ConfigError  # noqa: E402
from levanter_mars.training.errors import CheckpointError, ExitCode  # noqa: E402

#: Tokenizers whose size pre-flight knows without loading them (the HF hub is not contacted): (vocab, eos id).
KNOWN_TOKENIZERS = {"gpt2": (50257, 50256), "openai-community/gpt2": (50257, 50256)}


def vocabulary(data_config) -> tuple[int, Optional[int]]:
    name = str(data_config.tokenizer)
    if name in KNOWN_TOKENIZERS:
        return KNOWN_TOKENIZERS[name]
    try:
        tokenizer = data_config.the_tokenizer
    except Exception as e:  # noqa: BLE001 - reported with the field's name
        raise ConfigError(f"data.tokenizer: cannot load {name!r} offline to size the vocabulary: {e}") from None
    return len(tokenizer), tokenizer.eos_token_id


def check(config, devices: int) -> list[str]:
    """The training program's own validation, for the slice's devices, offline (returns what that skips). A bucket
    still the shipped placeholder is no reason not to size the program: the launcher and training refuse it."""
    from levanter_mars.training import validation

    return validation.validate(config, device_count=devices, offline=True, elsewhere=True, placeholders=False)


def preflight(config_path: str, tpu_type: str, num_slices: int = 1, overrides: Sequence[str] = ()) -> Verdict:
    """Raises ConfigError/LaunchError (bad input) or PreflightError (no compiler) before compiling anything."""
    from levanter_mars.infra.preflight.capacity import usable_hbm
    from levanter_mars.infra.preflight.eval_steps import lower_eval_programs
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training.run.identity import stable_run_id
    from levanter_mars.infra.preflight.step import compile_program, lower_train_step

    seconds = {}
    start = time.perf_counter()
    if num_slices < 1:
        raise LaunchError(f"--num_slices must be >= 1, got {num_slices}")
    target = tpu_target(slice_type(tpu_type))
    config = parse_train_config(["--config_path", config_path, *overrides])
    config.trainer.id = stable_run_id(config)
    check(config, target.devices * num_slices)
    vocab, eos = vocabulary(config.data)
    devices = abstract_devices(target, num_slices)
    seconds["setup"] = time.perf_counter() - start
    step = lower_train_step(config, devices, num_slices, vocab, eos)
    seconds["build_and_lower"] = time.perf_counter() - start - sum(seconds.values())
    compiled = compile_program(step.lowered)
    seconds["compile"] = compiled.compile_seconds
    usable = usable_hbm(compiled, devices, target.hbm_bytes_per_chip)
    seconds["usable_hbm"] = time.perf_counter() - start - sum(seconds.values())
    eval_steps, eval_skipped = {}, None
    if compiled.out_of_memory is None and compiled.total_bytes <= usable.bytes:
        eval_start = time.perf_counter()
        lowered = lower_eval_programs(step, config, eos)
        eval_steps = {name: compile_program(program) for name, program in lowered.items()}
        seconds["eval_lower_and_compile"] = time.perf_counter() - eval_start
    else:
        eval_skipped = "the train step does not fit (the verdict is already no)"
    trainer = step.trainer_config
    per_token = config.model.flops_per_token(vocab)
    tokens = trainer.train_batch_size * config.model.Pos.size
    seconds["total"] = time.perf_counter() - start
    return Verdict(
        config_path, target, num_slices, step.parameter_bytes, step.optimizer_state_bytes, compiled, usable,
        per_device_parallelism=trainer.per_device_parallelism, train_batch_size=trainer.train_batch_size,
        data_axis_size=trainer.data_axis_size,
        gradient_checkpointing=getattr(config.model, "gradient_checkpointing", None),
        eval_steps=eval_steps, per_device_eval_parallelism=trainer.per_device_eval_parallelism,
        eval_batch_size=trainer.eval_batch_size, eval_skipped=eval_skipped,
        model_flops_per_step=3 * per_token * tokens if per_token is not None else None,
        seconds={k: round(v, 1) for k, v in seconds.items()},
    )


def _parser() -> argparse.ArgumentParser:
    description = __doc__.split("\n\n")[1]
    parser = argparse.ArgumentParser(prog="python -m levanter_mars.main.preflight", description=description)
    parser.add_argument("--config_path", required=True, help="the training YAML")
    parser.add_argument("--tpu_type", required=True, type=canonical_tpu_type,
                        help="slice type, as the launcher takes it (v4-32, v5litepod-16 or v5e-16)")
    parser.add_argument("--num_slices", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    return parser


def cli(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = _parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as e:
        return 2 if e.code else 0
    logging.basicConfig(level=logging.WARNING)
    try:
        verdict = preflight(args.config_path, args.tpu_type, args.num_slices, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (LaunchError, PreflightError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:  # a write probe failed: the storage, not the config
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.CHECKPOINT_STORAGE
    print(verdict.table())
    if not verdict.fits:
        print(f"does not fit: {verdict.refusal()}", file=sys.stderr)
    if args.json:
        print(json_line(verdict.to_json()))
    return 0 if verdict.fits else 2


if __name__ == "__main__":
    sys.exit(cli())
