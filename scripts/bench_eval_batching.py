"""Throughput of the eval harness's log-likelihood scoring (requests/s), by how requests are batched.

* ``packed (Levanter)``: Levanter's own packing and scoring (several requests per row, positions not restarted:
  wrong for GPT-2, defect 20 in levanter_mars.compat), the baseline;
* ``packed, positions from 0``: levanter_mars's scoring (same packing, positions restart for each request);
* ``one request per row``: levanter_mars's scoring with no packing.

Requests are random tokens with HellaSwag-like lengths (context 40-120 tokens, continuation 8-40); the model is
randomly initialized (speed does not depend on the weights). Each option runs once to compile, then is timed.
Prints a table with each option's ratio to the baseline, measured in the same run.

    python scripts/bench_eval_batching.py --model nano --requests 256
    python scripts/bench_eval_batching.py --model small --requests 24 --batch 2
"""

from __future__ import annotations

import argparse
import time

import haliax as hax
import jax
import numpy as np
from jax.sharding import Mesh
from levanter.data.packing import PromptCompletion, greedy_pack_prompt_completions
from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker
from levanter.models.gpt2 import Gpt2Config

from levanter_mars.compat import lm_eval_scoring

MODELS = {
    # config/gpt2_nano_mars.yaml's model, and GPT-2 small's shape.
    "nano": Gpt2Config(seq_len=128, hidden_dim=64, num_layers=2, num_heads=4, gradient_checkpointing=False),
    "small": Gpt2Config(seq_len=1024, hidden_dim=768, num_layers=12, num_heads=12, gradient_checkpointing=False),
}
VOCAB = {"nano": 4096, "small": 50257}


def make_requests(n: int, vocab: int, max_length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        cont = int(rng.integers(8, 41))
        ctx = min(int(rng.integers(40, 121)), max_length - cont)
        out.append((None, rng.integers(0, vocab, ctx).tolist(), rng.integers(0, vocab, cont).tolist()))
    return out


def levanter_packed(worker, requests):
    """Levanter's path from tokens on: greedy packing into rows, its jitted per-segment scoring."""
    from levanter.data.loader import stack_batches

    sequences = [PromptCompletion(c + x, len(c), i) for i, (_, c, x) in enumerate(requests)]
    packed = greedy_pack_prompt_completions(worker.EvalPos, sequences, pad_token=0, max_segments_per_example=64)
    for batch in stack_batches(iter(packed), worker.EvalPos, worker.EvalBatch):
        jax.block_until_ready(worker.dispatch_loglikelihood(batch))
    return len(packed)


def ours(worker, requests, per_row):
    LevanterHarnessLM(worker)._loglikelihood_tokens(requests)
    windows = [lm_eval_scoring.lm_eval_window(c, x, worker.EvalPos.size) for _, c, x in requests]
    (tokens, _, _), _ = lm_eval_scoring.pack_windows(windows, worker.EvalPos.size, per_row)
    return len(tokens)


def timed(make_worker, run, requests):
    worker = make_worker()
    run(worker, requests[:1])  # compiles
    start = time.perf_counter()
    rows = run(worker, requests)
    return len(requests) / (time.perf_counter() - start), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="nano")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="rows per forward (EvalBatch)")
    args = parser.parse_args()

    config = MODELS[args.model]
    model = config.build(hax.Axis("vocab", VOCAB[args.model]), key=jax.random.PRNGKey(0))
    requests = make_requests(args.requests, VOCAB[args.model], config.seq_len)
    Batch = hax.Axis("batch", args.batch)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    mapping = {"batch": "data"}

    def worker():
        return _LmEvalHarnessWorker(Batch, config.Pos, model, mapping, None, None, max_packed_segments=64)

    rows = []
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping(mapping):
        rows.append(("packed (Levanter), baseline", *timed(worker, levanter_packed, requests)))
        for label, per_row in (("packed, positions from 0", 64), ("one request per row", 1)):
            with lm_eval_scoring.score_as_lm_eval(max_per_row=per_row):
                rows.append((label, *timed(worker, lambda w, r: ours(w, r, per_row), requests)))
    base = rows[0][1]
    print(f"model {args.model} (seq_len {config.seq_len}), {args.requests} requests, {args.batch} rows per forward")
    print("| batching | rows | requests/s | vs baseline |\n|---|---:|---:|---:|")
    for label, rate, n_rows in rows:
        print(f"| {label} | {n_rows} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
