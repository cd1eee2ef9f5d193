"""Every Levanter LM family x every MARS optimizer: a tiny model trained a few steps through the CLI, offline.

Each run uses the embedded corpus and its own tokenizer, evaluates the loss, and exports to HF at its last step
(every family Levanter ships has a converter built offline). Prints one row per run: exit code, first and last train
loss, first and last eval loss, whether the HF export was written, and the wall time.

    python scripts/family_matrix.py --workdir /tmp/matrix [--steps 10] [--families llama mixtral] [--optimizers mars-m]

Run from the repository root; sequential (one run at a time), 1 to 4 minutes per run on 2 shared CPU cores. Rows go\nto WORKDIR/matrix.jsonl as they finish; a second invocation skips the pairs that already passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.families import TINY_MODELS  # noqa: E402
from tests.helpers.training import losses, output, run_cli, run_paths, tiny_config  # noqa: E402

OPTIMIZERS = {
    "mars-adamw": {"type": "mars-adamw"},
    "mars-m": {"type": "mars-m", "learning_rate": 1e-2},
    "exact": {"type": "mars-adamw", "exact": True},
    "mars-m efficient": {"type": "mars-m", "learning_rate": 1e-2, "efficient": True},
    "mars-lion": {"type": "mars-lion", "learning_rate": 1e-3, "learning_rate_1d": 1e-3},
    "mars-shampoo": {"type": "mars-shampoo"},
}


def run_one(workdir: Path, corpus: Path, family: str, optimizer: str, steps: int) -> dict:
    run_id = f"{family}-{optimizer.replace(' ', '-')}"
    hf_dir = workdir / "hf" / run_id
    overrides = {
        "model": dict(TINY_MODELS[family], seq_len=64, gradient_checkpointing=False),
        "optimizer": dict(OPTIMIZERS[optimizer], warmup=0.1, min_lr_ratio=0.1),
        "trainer": {"num_train_steps": steps, "steps_per_eval": steps // 2, "checkpointer": {"keep": []}},
        "hf_save_path": str(hf_dir),
        "hf_save_steps": steps,
    }
    config = tiny_config(workdir, corpus, run_id, overrides)
    # tiny_config merges dicts key by key; the optimizer section must be exactly this one.
    text = yaml.safe_load(config.read_text())
    text["optimizer"] = overrides["optimizer"]
    config.write_text(yaml.safe_dump(text, sort_keys=False))
    start = time.time()
    proc = run_cli(config, timeout=900)
    wall = time.time() - start
    paths = run_paths(workdir, run_id)
    train = losses(paths["metrics"]) if paths["metrics"].exists() else {}
    evals = losses(paths["metrics"], "eval/loss") if paths["metrics"].exists() else {}
    exported = any(hf_dir.rglob("config.json"))
    row = {
        "family": family, "optimizer": optimizer, "rc": proc.returncode, "steps": len(train),
        "train_first": train.get(0), "train_last": train.get(max(train)) if train else None,
        "eval_first": evals.get(min(evals)) if evals else None, "eval_last": evals.get(max(evals)) if evals else None,
        "hf_export": exported, "wall_s": round(wall, 1),
    }
    if proc.returncode != 0:
        row["error"] = output(proc)[-1500:]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--families", nargs="*", default=["llama", "mixtral", "mistral", "qwen", "gemma", "olmo2", "gpt2"])
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    args = parser.parse_args(argv)

    from levanter_mars.training.data import pydocs_corpus

    workdir = Path(args.workdir).resolve()
    # Offline, and the runs of one family share compiled programs (eval, export) through the persistent cache.
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[flag] = "1"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(workdir / "jax-cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("WANDB_MODE", "offline")
    corpus = workdir / "pydocs"
    pydocs_corpus.prepare(corpus)
    # Optimizer-major, so that a cut-short session still covers every family; rows already recorded with exit 0 in
    # matrix.jsonl are kept (the script resumes).
    record = workdir / "matrix.jsonl"
    done = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    rows = [r for r in done if r["rc"] == 0]
    finished = {(r["family"], r["optimizer"]) for r in rows}
    print("| family | optimizer | rc | steps | train loss first -> last | eval loss first -> last | HF export | s |")
    print("|---|---|---|---|---|---|---|---|")
    for optimizer in args.optimizers:
        for family in args.families:
            if (family, optimizer) in finished:
                row = next(r for r in rows if (r["family"], r["optimizer"]) == (family, optimizer))
            else:
                row = run_one(workdir, corpus, family, optimizer, args.steps)
                rows.append(row)
                with record.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            print(
                f"| {family} | {optimizer} | {row['rc']} | {row['steps']} | {fmt(row['train_first'])} -> "
                f"{fmt(row['train_last'])} | {fmt(row['eval_first'])} -> {fmt(row['eval_last'])} | "
                f"{'yes' if row['hf_export'] else 'no'} | {row['wall_s']} |",
                flush=True,
            )
    failed = [r for r in rows if r["rc"] != 0 or not r["hf_export"]]
    for r in failed:
        print(f"\nFAILED {r['family']} x {r['optimizer']}:\n{r.get('error', 'no HF export')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
