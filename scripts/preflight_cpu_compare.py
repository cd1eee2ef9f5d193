"""The same train step, compiled by XLA:CPU on simulated CPU devices and by the TPU compiler for a slice: per-device
memory side by side (the comparison in docs/pods.md).

    python scripts/preflight_cpu_compare.py --config_path config/gpt2_small_mars.yaml --tpu_type v4-32 \
        [--tpu_json docs/pods/gpt2_small_mars__v4-32.json] [-- overrides]

Both programs come from ``infra/preflight/step.py`` (the trainer's step on the given devices); only the devices and
so the compiler differ. ``--tpu_json`` takes the TPU side from a stored pre-flight of the same config instead of
compiling it again. Prints one JSON line: per-device arguments, temporaries and totals for both, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_path", required=True)
    parser.add_argument("--tpu_type", required=True)
    parser.add_argument("--tpu_json", default=None)
    argv = sys.argv[1:]
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)

    from levanter_mars.infra.preflight.topology import tpu_target
    from levanter_mars.infra.slices import slice_type

    target = tpu_target(slice_type(args.tpu_type))
    # As many CPU devices as the slice has chips, set before jax starts.
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={target.devices}"

    import jax

    from levanter_mars.program_config import parse_train_config
    from levanter_mars.infra.preflight.step import compile_program, lower_train_step
    from levanter_mars.infra.preflight.topology import abstract_devices
    from levanter_mars.main.preflight import vocabulary

    config = parse_train_config(["--config_path", args.config_path, *overrides])
    vocab, eos = vocabulary(config.data)
    figures = {}
    if args.tpu_json:
        stored = json.load(open(args.tpu_json))
        figures["tpu"] = {**stored["per_chip"], "compile_seconds": stored["compile_seconds"]}
    for name, devices in (("tpu", None), ("cpu", jax.devices("cpu"))):
        if name in figures:
            continue
        step = lower_train_step(config, devices or abstract_devices(target), 1, vocab, eos)
        compiled = compile_program(step.lowered)
        figures[name] = {
            "arguments": compiled.argument_bytes, "temporaries": compiled.temp_bytes, "total": compiled.total_bytes,
            "parameters": step.parameter_bytes, "optimizer_state": step.optimizer_state_bytes,
            "compile_seconds": round(compiled.compile_seconds, 1),
        }
        print(name, figures[name], file=sys.stderr, flush=True)
    figures["temporaries_cpu_over_tpu"] = figures["cpu"]["temporaries"] / figures["tpu"]["temporaries"]
    print(json.dumps({"config": args.config_path, "tpu_type": args.tpu_type, "devices": target.devices, **figures}))
