"""Full train-step cost (forward + backward + optimizer update, one jitted program) for AdamW, MARS-AdamW approx and
MARS-AdamW exact, MARS-M approx and efficient and the Muon baseline (``--quick``: the first three), on Levanter's GPT-2.

Every optimizer runs the same step on the same batch: the loss is a next-token cross-entropy over the model's logits
(``levanter_mars.bench.models.next_token_loss``, written here so the benchmark also runs on jax >= 0.8, where the
pinned Levanter's loss fails), its gradient comes from ``eqx.filter_value_and_grad``, and exact MARS receives
``obj_fn(params) = loss(params, same batch)``, so its extra gradient at the previous parameters is a second full
forward/backward on the same batch, as ``MarsTrainer``'s ``BatchObjective`` provides in training (without
microbatching, which these batches do not need). Params and optimizer state are donated, as in Levanter's trainer.

    python scripts/bench_step.py                                # nano and the convergence benchmark's model
    python scripts/bench_step.py --sizes small --batch-size 16  # GPT-2 small (on an accelerator)
"""

from __future__ import annotations

import argparse

from levanter_mars.bench import report
from levanter_mars.compat import newer_jax

GOAL_APPROX_RATIO = 1.02  # MARS-AdamW approx step / AdamW step (issue 14)
GOAL_EXACT_RATIO = 2.05  # MARS-AdamW exact step / approx step
QUICK_OPTIMIZERS = ["adamw", "mars-adamw-approx-fp32", "mars-adamw-exact-fp32"]
OPTIMIZERS = QUICK_OPTIMIZERS + ["mars-m-approx-fp32", "mars-m-efficient-fp32", "muon-fp32"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_common_arguments(parser)
    parser.add_argument("--sizes", default=None, help="comma-separated: nano, bench, small, medium (default: nano,bench; --quick: nano)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: per size)")
    parser.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="forward/backward dtype (parameters stay float32); auto: float32 on CPU, else bfloat16")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per optimizer (default 5; --quick: 2)")
    parser.add_argument("--optimizers", default=None, help="comma-separated optimizer names (default: 6; --quick: 3)")
    parser.add_argument("--baseline-ref", default=None, help="also time ours as of this git ref (named NAME@REF)")
    return parser.parse_args(argv)


def bench_size(size, cases, batch_size: int, compute_dtype, repeats: int) -> dict:
    import equinox as eqx

    from levanter_mars.bench import models, speed

    model, config = models.init_gpt2(size)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    del model
    tokens = models.token_batch(config, size.vocab_size, batch_size)
    count = models.parameter_count(params)
    report.log(f"{size.name}: {count / 1e6:.1f}M parameters, batch {batch_size} x {config.Pos.size}")

    def loss(params, tokens):
        return models.next_token_loss(eqx.combine(params, static), tokens, compute_dtype=compute_dtype)

    def gradient_and_objective(params, tokens):
        grads = eqx.filter_grad(loss)(params, tokens)
        return grads, lambda p: loss(p, tokens)

    rows = speed.compare(cases, params, tokens, gradient_and_objective, repeats=repeats)
    by_name = {r["optimizer"]: r for r in rows}
    approx, exact = by_name.get("mars-adamw-approx-fp32"), by_name.get("mars-adamw-exact-fp32")
    for row in rows:
        r = speed.ratios(row, approx)
        row["ratio_to_approx"], row["cpu_ratio_to_approx"] = r["wall"], r["cpu"]
    return {
        "size": size.name,
        "config": size.config_file,
        "vocab_size": size.vocab_size,
        "parameters": count,
        "batch_size": batch_size,
        "seq_len": config.Pos.size,
        "tokens_per_step": batch_size * config.Pos.size,
        "rows": rows,
        "approx_to_adamw": None if approx is None else {"wall": approx["ratio_to_adamw"], "cpu": approx["cpu_ratio_to_adamw"]},
        "exact_to_approx": None if exact is None else {"wall": exact["ratio_to_approx"], "cpu": exact["cpu_ratio_to_approx"]},
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    report.select_platform(args.platform)
    from levanter_mars.bench import models

    levanter_import = newer_jax.levanter_importable()  # before anything imports levanter_mars.optim
    import jax
    import jax.numpy as jnp

    from levanter_mars.bench import optimizers as opt
    from levanter_mars.bench import speed
    from levanter_mars.bench.timing import device_peak_bytes

    sizes = models.select_sizes(args.sizes or ("nano" if args.quick else "nano,bench"))
    cases = opt.select(args.optimizers, QUICK_OPTIMIZERS if args.quick else OPTIMIZERS, args.baseline_ref)
    repeats = args.repeats or (2 if args.quick else 5)
    machine = report.machine_description()
    report.log(report.describe_machine(machine))
    if args.compute_dtype == "auto":
        compute_dtype = jnp.float32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16
    else:
        compute_dtype = jnp.dtype(args.compute_dtype)

    results = [bench_size(size, cases, args.batch_size or size.batch_size, compute_dtype, repeats) for size in sizes]
    basis = speed.ratio_basis(machine["platform"])
    goals = []
    for r in results:
        for key, label, limit in (("approx_to_adamw", "approx step / AdamW", GOAL_APPROX_RATIO),
                                  ("exact_to_approx", "exact step / approx", GOAL_EXACT_RATIO)):
            measured = None if r[key] is None else r[key][basis]
            goals.append(report.goal_line(f"{r['size']}: MARS-AdamW {label} ({basis} time)", measured, limit))

    output = {
        "benchmark": "train_step",
        "quick": args.quick,
        "machine": machine,
        "levanter_import": levanter_import,
        "compute_dtype": jnp.dtype(compute_dtype).name,
        "repeats": repeats,
        "goal_basis": basis,
        "timed": "jit(value_and_grad(next-token loss) + update + apply_updates), the optimizer inside the non-finite "
                 "guard (optim.guard, as every trainer runs it), params and state donated, same batch",
        "peak_memory_source": "compiled.memory_analysis(): arguments + outputs - aliased + temporaries",
        "device_peak_bytes_in_use": device_peak_bytes(),
        "sizes": results,
        "goals": goals,
    }
    columns = list(speed.COLUMNS[:3]) + [("ratio_to_approx", "x approx")] + list(speed.COLUMNS[3:6]) + [
        ("cpu_ratio_to_approx", "CPU x approx")] + list(speed.COLUMNS[6:])
    tables = [f"Train-step benchmark. {report.describe_machine(machine)}; levanter import: {levanter_import}; compute "
              f"{output['compute_dtype']}; {repeats} interleaved repeats, medians of per-repeat ratios; goals on {basis} time."]
    for r in results:
        title = (f"{r['size']} ({r['parameters'] / 1e6:.1f}M parameters, {r['config']}, vocab {r['vocab_size']}, "
                 f"batch {r['batch_size']} x {r['seq_len']})")
        tables.append(report.format_table(r["rows"], columns, title=title))
    tables.append(report.format_table(goals, report.GOAL_COLUMNS, title="Goals"))
    report.emit(output, tables, args.json)


if __name__ == "__main__":
    main()
