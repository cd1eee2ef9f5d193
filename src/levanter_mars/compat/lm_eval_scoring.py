"""Defect 20: Levanter's eval harness scores requests otherwise than lm-eval does.

Levanter 1.2.dev1644 packs up to 64 requests into one ``seq_len`` row with a segment-aware attention mask but gives
the model the positions 0..seq_len-1 of the whole row, so every request after the first in its row is scored at
shifted positions, which a model with learned absolute position embeddings (GPT-2) sees. It also splits a request
into context and continuation by tokenizing the context alone (lm-eval first moves the context's trailing whitespace
into the continuation), and of a request longer than the model keeps ``seq_len`` tokens where lm-eval's ``hf``
backend keeps ``seq_len + 1`` (its input is all of them but the last, which is only a target).

:func:`score_as_lm_eval` replaces the scoring, keeping Levanter's worker protocol (a message, then one payload shaped
like the worker's dummy batch, broadcast from process 0). lm-eval's own ``TemplateLM.loglikelihood`` splits each
request; each request becomes lm-eval's input window (:func:`lm_eval_window`); windows are packed into rows as
Levanter packs them, but positions restart at 0 in every window (:func:`segment_positions`) and each row carries its
targets (:class:`ScoringRows`), so a window of ``seq_len`` input tokens fits a row. The payload is a
:class:`ScoringRows` on every process, because every process enters this context (``run_eval_harness`` does).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np

from levanter_mars.compat.patching import patched

MAX_REQUESTS_PER_ROW = 64
"""Requests packed into one row at most (Levanter's own limit); docs/evals.md has the throughput measurements."""


class ScoringRows(eqx.Module):
    """Rows of packed requests, each named (batch, position)."""

    tokens: hax.NamedArray
    targets: hax.NamedArray
    """The next token where it is scored (a continuation token), -1 elsewhere."""
    segment_ids: hax.NamedArray
    """Which request of its row a token belongs to (0, 1, ...), -1 for padding."""


def lm_eval_window(context: list[int], continuation: list[int], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """lm-eval's ``hf`` backend: of context + continuation, the last ``max_length + 1`` tokens; the input is all but
    the last, and each continuation token is the target of the input position before it. Returns (input, targets)."""
    if not continuation:
        raise ValueError("lm-eval request with an empty continuation")
    if len(continuation) > max_length:  # lm-eval's hf backend asserts the same
        raise ValueError(f"continuation of {len(continuation)} tokens is longer than max_length={max_length}")
    whole = np.asarray(list(context) + list(continuation), dtype=np.int32)[-(max_length + 1) :]
    targets = np.full(len(whole) - 1, -1, dtype=np.int32)
    targets[-len(continuation) :] = whole[-len(continuation) :]
    return whole[:-1], targets


def pack_windows(windows: list[tuple[np.ndarray, np.ndarray]], row_length: int, max_per_row: int):
    """Packs windows into rows, in order (Levanter's ``pack_documents``). Returns numpy (tokens, targets,
    segment_ids), each [rows, row_length], and each window's (row, start, end)."""
    from levanter.data.packing import pack_documents

    packs = pack_documents(
        lengths=np.array([len(tokens) for tokens, _ in windows]), max_length=row_length,
        max_segments_per_example=max_per_row,
    )
    tokens = np.zeros((len(packs), row_length), dtype=np.int32)
    targets = np.full_like(tokens, -1)
    segments = np.full_like(tokens, -1)
    where: list[tuple[int, int, int]] = [(0, 0, 0)] * len(windows)
    for row, pack in enumerate(packs):
        start = 0
        for segment, index in enumerate(pack):
            window_tokens, window_targets = windows[index]
            end = start + len(window_tokens)
            tokens[row, start:end], targets[row, start:end] = window_tokens, window_targets
            segments[row, start:end] = segment
            where[index] = (row, start, end)
            start = end
    return (tokens, targets, segments), where


def segment_positions(segment_ids: hax.NamedArray, Pos: hax.Axis) -> hax.NamedArray:
    """Each token's position within its segment: 0 where a segment starts (a token whose segment id differs from
    the one before it)."""
    ids = segment_ids.rearrange((..., Pos))
    index = jnp.arange(Pos.size, dtype=jnp.int32)
    first = jnp.ones(ids.array.shape[:-1] + (1,), dtype=bool)
    starts = jnp.concatenate([first, ids.array[..., 1:] != ids.array[..., :-1]], axis=-1)
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=ids.array.ndim - 1)
    return hax.named(index - start_index, ids.axes)


def score_rows(model, rows: ScoringRows, mp=None) -> tuple[hax.NamedArray, hax.NamedArray]:
    """Per token: the log-likelihood of its target and whether the target is the argmax (0 and True where nothing
    is scored). Each request in a row sees only itself (segment mask) at positions from 0."""
    from levanter.layers.attention import AttentionMask

    if mp is not None:
        model = mp.cast_to_compute(model)
    Pos = rows.tokens.resolve_axis("position")
    mask = AttentionMask.causal().with_segment_ids(rows.segment_ids)
    logits = model(rows.tokens, attn_mask=mask, pos_ids=segment_positions(rows.segment_ids, Pos))
    logits = logits.astype(jnp.float32).rearrange((..., model.Vocab))
    scored = rows.targets.rearrange(logits.axes[:-1]) >= 0
    targets = jnp.where(scored.array, rows.targets.rearrange(logits.axes[:-1]).array, 0)
    log_probs = jax.nn.log_softmax(logits.array, axis=-1)
    token_ll = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    greedy = jnp.argmax(logits.array, axis=-1) == targets
    axes = logits.axes[:-1]
    return hax.named(jnp.where(scored.array, token_ll, 0.0), axes), hax.named(greedy | ~scored.array, axes)


def scoring_program(axis_resources, mp=None):
    """The jitted program that scores one batch of rows (``(model, rows) -> score_rows``), as the harness workers
    run it (pre-flight compiles the same one): outputs unsharded, as Levanter's worker protocol wants them."""
    return hax.named_jit(lambda model, rows: score_rows(model, rows, mp), axis_resources=axis_resources,
                         out_axis_resources={})


def empty_rows(Batch: hax.Axis, Pos: hax.Axis) -> ScoringRows:
    zeros = hax.zeros((Batch, Pos), dtype=jnp.int32)
    return ScoringRows(tokens=zeros, targets=zeros - 1, segment_ids=zeros - 1)


def _batches(arrays, Batch: hax.Axis, Pos: hax.Axis) -> Iterator[tuple[int, ScoringRows]]:
    """Rows in groups of Batch.size, the last filled up with empty rows."""
    tokens, targets, segments = arrays
    for first in range(0, len(tokens), Batch.size):
        fill = Batch.size - len(tokens[first : first + Batch.size])
        parts = []
        for array, pad in ((tokens, 0), (targets, -1), (segments, -1)):
            part = array[first : first + Batch.size]
            part = np.concatenate([part, np.full((fill, Pos.size), pad, dtype=np.int32)])
            parts.append(hax.named(jnp.asarray(part), (Batch, Pos)))
        yield first, ScoringRows(*parts)


def loglikelihood_tokens(self, requests, disable_tqdm: bool = False, max_per_row: Optional[int] = None):
    """``TemplateLM._loglikelihood_tokens`` for Levanter's harness: ``requests`` are lm-eval's
    ((context, continuation), context tokens, continuation tokens); returns (log-likelihood, is greedy) each."""
    Batch, Pos = self.EvalBatch, self.EvalPos
    windows = [lm_eval_window(context, continuation, Pos.size) for _, context, continuation in requests]
    arrays, where = pack_windows(windows, Pos.size, max_per_row or MAX_REQUESTS_PER_ROW)
    token_ll = np.zeros(arrays[0].shape, dtype=np.float64)
    greedy = np.zeros(arrays[0].shape, dtype=bool)
    for first, rows in _batches(arrays, Batch, Pos):
        batch_ll, batch_greedy = self.leader.dispatch_loglikelihood(rows)
        count = min(Batch.size, len(token_ll) - first)
        token_ll[first : first + count] = np.asarray(jax.device_get(batch_ll.array))[:count]
        greedy[first : first + count] = np.asarray(jax.device_get(batch_greedy.array))[:count]
    return [(float(token_ll[row, a:b].sum()), bool(greedy[row, a:b].all())) for row, a, b in where]


def loglikelihood(self, requests, disable_tqdm: bool = False):
    """lm-eval's own split (``TemplateLM.loglikelihood``), after Levanter's sample logging of the raw requests."""
    from lm_eval.api.model import TemplateLM

    bucket = self._prepare_bucket(getattr(self, "_current_task", "loglikelihood_task"))
    if bucket is not None:
        bucket.extend({"prompt": r.args[0], "generation": r.args[1]} for r in requests)
    return TemplateLM.loglikelihood(self, requests, disable_tqdm=disable_tqdm)


@contextlib.contextmanager
def score_as_lm_eval(max_per_row: Optional[int] = None) -> Iterator[None]:
    """Defect 20. Every ``_LmEvalHarnessWorker`` made meanwhile scores :class:`ScoringRows` payloads with
    :func:`score_rows`, and Levanter's harness LM splits, truncates and packs requests as described above."""
    from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker

    original_init = _LmEvalHarnessWorker.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._dummy_batch = hax.shard(empty_rows(self.EvalBatch, self.EvalPos), {})
        self._jit_loglikelihood = scoring_program(self.axis_resources, self.mp)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False):
        return loglikelihood_tokens(self, requests, disable_tqdm, max_per_row)

    with patched(_LmEvalHarnessWorker, __init__=__init__), patched(
        LevanterHarnessLM, loglikelihood=loglikelihood, _loglikelihood_tokens=_loglikelihood_tokens
    ):
        yield
