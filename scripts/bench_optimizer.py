"""Optimizer update cost on GPT-2 parameter trees: time, state bytes per parameter and peak memory, against AdamW.

What one timed call is: ``update(grads, state, params)`` of the whole optimizer chain (global clip, the optimizer,
weight decay, learning rate) inside the non-finite guard every trainer wraps it in (``optim.guard``: the update
training runs), followed by ``optax.apply_updates``, jitted as one program with params and state donated, on a fixed
gradient tree. The traffic of the same program without the guard is reported beside it, so the guard's cost shows. For exact MARS, ``update`` also receives ``obj_fn(params) = 0.5 * ||params||^2``, whose
gradient at the previous parameters is one elementwise pass: the timing covers everything exact mode adds to the
optimizer (casting and storing the previous parameters, differentiating the objective's cheap stand-in, clipping the
result, zeroing it at step 1) but not the real extra forward/backward pass, which ``bench_step.py`` measures.

Peak memory is XLA's accounting of the compiled update (arguments + outputs - donated + temporaries), available on
every backend without running it; on GPU/TPU the allocator's process-wide peak is reported too.

    python scripts/bench_optimizer.py                    # nano, GPT-2 small (124M) and medium (355M)
    python scripts/bench_optimizer.py --sizes small --optimizers adamw,mars-adamw-approx-fp32 --repeats 9
    python scripts/bench_optimizer.py --baseline-ref main  # ours also as of git ref main, timed in the same run
    python scripts/bench_optimizer.py --sizes small --tpu v4,v5e,v5p,v6e,v5e-fsdp16 --no-timing --baseline-ref 1def919

Beside the times, every row reports the update's memory traffic from the optimized HLO (XLA's bytes accessed, in
float32 parameter-sized passes, and the buffer copies XLA inserted), so a regression shows without a timer.

``--tpu TARGETS`` also compiles every update with XLA:TPU (``libtpu``, ahead of time, no TPU needed;
:mod:`levanter_mars.bench.tpu_compile`) and adds, per target and construction (``--constructions``: the gradient
donated with the state, or its own input), its bytes accessed in float32 parameter passes (per chip) with and
without the guard, the ratio to AdamW's built the same way, and the temporaries. ``--no-timing`` leaves the CPU
timing out (TPU columns only). The JSON names the command and the compiler (jax, libtpu) that made it:
``scripts/stale_tpu_figures.py`` lists the figures whose compiler is no longer the lock's.
"""

from __future__ import annotations

import argparse

from levanter_mars.bench import report
from levanter_mars.compat import newer_jax
from levanter_mars.versions import command_line, compiler_versions

GOAL_BF16_UPDATE_RATIO = 1.3  # MARS-AdamW approx update time with bf16 buffers / AdamW's
GOAL_STATE_BYTES = 8.0  # AdamW's fp32 state, bytes per parameter
HEADLINE = "mars-adamw-approx-fp32"
# --quick compiles few programs (compilation dominates a smoke run): the baseline, Levanter's, ours approx/exact.
QUICK_OPTIMIZERS = ["adamw", "levanter-mars", HEADLINE, "mars-adamw-exact-bf16"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_common_arguments(parser)
    parser.add_argument("--sizes", default=None, help="comma-separated: nano, bench, small, medium (default: nano,small,medium; --quick: nano)")
    parser.add_argument("--optimizers", default=None, help="comma-separated optimizer names (default: all; --quick: 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per optimizer (default 5; --quick: 2)")
    parser.add_argument("--baseline-ref", default=None, help="also time ours as of this git ref (named NAME@REF)")
    parser.add_argument("--tpu", default=None, help="TPU targets to compile for: v4,v5e,v5p,v6e,v5e-fsdp16")
    parser.add_argument("--no-timing", action="store_true", help="with --tpu: only the TPU-compiled columns")
    parser.add_argument("--constructions", default="donated,own-gradient",
                        help="with --tpu: how the program receives the gradient: donated, own-gradient")
    parser.add_argument("--no-unguarded", action="store_true",
                        help="with --tpu: compile only the guarded update (no column without the guard)")
    return parser.parse_args(argv)


def quadratic(params):
    """The exact-mode ``obj_fn`` of this benchmark: its gradient is the parameters themselves."""
    import jax
    import jax.numpy as jnp

    return 0.5 * sum(jnp.vdot(x, x) for x in jax.tree.leaves(params))


def fixed_gradient(params, grads):
    """The update benchmark's data are the gradient itself."""
    return grads, quadratic


def bench_size(size, cases, repeats: int, targets=(), timing: bool = True, constructions=(), unguarded=True) -> dict:
    from levanter_mars.bench import models, speed, tpu_compile

    if timing:
        model, _ = models.init_gpt2(size)
        params = models.trainable(model)
        del model
    else:  # compiling needs shapes only
        params = tpu_compile.abstract_gpt2_parameters(size)
    count = models.parameter_count(params)
    report.log(f"{size.name}: {count / 1e6:.1f}M parameters")
    if timing:
        rows = speed.compare(cases, params, models.like_gradients(params), fixed_gradient, repeats=repeats,
                             unguarded_traffic=unguarded)
    else:
        rows = [{"optimizer": case.name, "description": case.description} for case in cases]
    if targets:
        compiled = tpu_compile.compare(cases, params, fixed_gradient, targets, constructions, unguarded=unguarded,
                                       progress=report.log)
        for row in rows:
            row.update(compiled[row["optimizer"]])
    return {"size": size.name, "config": size.config_file, "model_overrides": dict(size.overrides),
            "vocab_size": size.vocab_size, "parameters": count, "rows": rows}


def size_goals(result: dict, basis: str) -> list[dict]:
    """The goals of one model size: update time and scratch memory of MARS-AdamW approx, and state bytes."""
    from levanter_mars.bench import optimizers as opt
    from levanter_mars.bench import speed

    size, by_name = result["size"], {r["optimizer"]: r for r in result["rows"]}
    goals = []
    headline, bf16 = by_name.get(HEADLINE), by_name.get(HEADLINE.replace("fp32", "bf16"))
    levanter, adamw = by_name.get(opt.LEVANTER_MARS), by_name.get(opt.ADAMW)
    if headline and levanter:
        goals.append(report.goal_line(f"{size}: {HEADLINE} update / AdamW ({basis} time; limit: Levanter's MARS)",
                                      headline[speed.ratio_key(basis)], levanter[speed.ratio_key(basis)]))
    if bf16:
        goals.append(report.goal_line(f"{size}: {bf16['optimizer']} update / AdamW ({basis} time)",
                                      bf16[speed.ratio_key(basis)], GOAL_BF16_UPDATE_RATIO))
    if headline and adamw and headline["temp_mib"] is not None:
        goals.append(report.goal_line(f"{size}: {HEADLINE} update scratch memory (limit: AdamW's)",
                                      headline["temp_mib"], adamw["temp_mib"], "MiB"))
    if "mars-m-efficient-fp32" in by_name and opt.MUON in by_name:  # the efficient form keeps Muon's state
        goals.append(report.goal_line(f"{size}: mars-m-efficient-fp32 state bytes/param (limit: Muon's)",
                                      by_name["mars-m-efficient-fp32"]["state_bytes_per_param"],
                                      by_name[opt.MUON]["state_bytes_per_param"], "B"))
    for name, row in by_name.items():
        if name.endswith("-bf16"):
            goals.append(report.goal_line(f"{size}: {name} state bytes/param", row["state_bytes_per_param"],
                                          GOAL_STATE_BYTES, "B"))
    return goals


#: The goals on XLA:TPU's figures of the update, against AdamW's and Muon's built the same way: MARS-AdamW's ratio to
#: AdamW, and MARS-M's passes over Muon's. Each for the update training runs (inside the non-finite guard) in bytes
#: accessed, and for the optimizer alone also in what its own operations move and in what crosses HBM (``bench.hlo``):
#: bytes accessed add XLA:TPU's staging between memory spaces, which the two others leave out.
TPU_GOALS = {"mars-adamw-approx-fp32": 1.55, "mars-adamw-approx-bf16": 1.25}
MARS_M = "mars-m-approx-fp32"
MARS_M_PASSES_OVER_MUON = 3.0
TPU_GOAL_FIGURES = {True: {"passes": "bytes accessed"},
                    False: {"passes": "bytes accessed", "own_passes": "own passes", "hbm_passes": "HBM passes"}}


def tpu_goals(result: dict, targets, constructions) -> list[dict]:
    from levanter_mars.bench import optimizers as opt
    from levanter_mars.bench.tpu_compile import key

    size, by_name = result["size"], {r["optimizer"]: r for r in result["rows"]}
    adamw, mars_m, muon = (by_name.get(name, {}) for name in (opt.ADAMW, MARS_M, opt.MUON))
    goals = []
    for target in targets:
        for c in constructions:
            for guarded, figures in TPU_GOAL_FIGURES.items():
                where = f"{target.name}, {c.name}, {'guarded' if guarded else 'unguarded'}"
                for figure, label in figures.items():
                    field = key(target, c, figure, guarded)
                    for name, limit in TPU_GOALS.items():
                        measured, base = by_name.get(name, {}).get(field), adamw.get(field)
                        if measured is not None and base:
                            goals.append(report.goal_line(f"{size}: {name} {label} / AdamW's ({where})",
                                                          measured / base, limit))
                    if mars_m.get(field) is not None and muon.get(field) is not None:
                        bound = f"limit: Muon's + {MARS_M_PASSES_OVER_MUON:g}"
                        goals.append(report.goal_line(f"{size}: {MARS_M} {label} ({where}; {bound})",
                                                      mars_m[field], muon[field] + MARS_M_PASSES_OVER_MUON, "passes"))
    return goals


def main(argv=None) -> None:
    args = parse_args(argv)
    report.select_platform(args.platform)
    from levanter_mars.bench import models

    levanter_import = newer_jax.levanter_importable()  # before anything imports levanter_mars.optim
    from levanter_mars.bench import optimizers as opt
    from levanter_mars.bench import speed
    from levanter_mars.bench.timing import device_peak_bytes

    sizes = models.select_sizes(args.sizes or ("nano" if args.quick else "nano,small,medium"))
    cases = opt.select(
        args.optimizers, QUICK_OPTIMIZERS if args.quick else [c.name for c in opt.all_cases()], args.baseline_ref
    )
    repeats = args.repeats or (2 if args.quick else 5)
    machine = report.machine_description()
    report.log(report.describe_machine(machine))
    from levanter_mars.bench import tpu_compile

    targets = tpu_compile.select_targets(args.tpu) if args.tpu else []
    constructions = tpu_compile.select_constructions(args.constructions) if targets else []
    if args.no_timing and not targets:
        raise SystemExit("--no-timing needs --tpu (there would be nothing to report)")
    timing_columns = list(speed.COLUMNS[:10]) + [("hlo_passes_unguarded", "HLO passes unguarded")] + list(speed.COLUMNS[10:])
    columns = (timing_columns if not args.no_timing else [speed.COLUMNS[0]]) + tpu_compile.columns(
        targets, constructions, unguarded=not args.no_unguarded)

    results = [bench_size(size, cases, repeats, targets, timing=not args.no_timing, constructions=constructions,
                          unguarded=not args.no_unguarded) for size in sizes]

    basis = speed.ratio_basis(machine["platform"])
    goals = [] if args.no_timing else [goal for result in results for goal in size_goals(result, basis)]
    goals += [goal for result in results for goal in tpu_goals(result, targets, constructions)]

    output = {
        "benchmark": "optimizer_update",
        "command": command_line(),
        "compiler": compiler_versions(),
        "quick": args.quick,
        "machine": machine,
        "levanter_import": levanter_import,
        "baseline_ref": args.baseline_ref,
        "repeats": repeats,
        "goal_basis": basis,
        "timed": "jit(update + apply_updates), the optimizer inside the non-finite guard (optim.guard), params and "
                 "state donated; exact: obj_fn = 0.5*||params||^2",
        "peak_memory_source": "compiled.memory_analysis(): arguments + outputs - aliased + temporaries",
        "device_peak_bytes_in_use": device_peak_bytes(),
        "tpu_targets": [t.name for t in targets],
        "tpu_constructions": {c.name: c.description for c in constructions},
        "tpu_figures": "XLA:TPU cost_analysis bytes accessed / fp32 parameter bytes (per chip), inside the non-finite "
                       "guard (<target>_<construction>_passes) and without it (..._unguarded_passes); "
                       "memory_analysis temp; own_passes: bench.hlo.own_traffic (staging left out)",
        "sizes": results,
        "goals": goals,
    }
    tables = [f"Optimizer update benchmark. {report.describe_machine(machine)}; compiler {output['compiler']}; levanter "
              f"import: {levanter_import}; {repeats} interleaved repeats, medians; x AdamW = median of per-repeat "
              f"ratios; goals on {basis} time, TPU goals per construction, guarded and alone."]
    for result in results:
        title = f"{result['size']} ({result['parameters'] / 1e6:.1f}M parameters, {result['config']}, vocab {result['vocab_size']})"
        tables.append(report.format_table(result["rows"], columns, title=title))
    tables.append(report.format_table(goals, report.GOAL_COLUMNS, title="Goals"))
    report.emit(output, tables, args.json)


if __name__ == "__main__":
    main()
