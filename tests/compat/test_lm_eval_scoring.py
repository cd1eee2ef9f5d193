"""Defect 20: the pinned Levanter's eval harness scores a request otherwise than lm-eval;
``levanter_mars.compat.lm_eval_scoring`` scores it as lm-eval does."""

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import pytest

from tests.helpers.compat import one_device_mesh


def _tiny_gpt2(seq_len=16):
    from levanter.models.gpt2 import Gpt2Config

    config = Gpt2Config(seq_len=seq_len, hidden_dim=16, num_layers=1, num_heads=2, gradient_checkpointing=False)
    model = config.build(hax.Axis("vocab", 32), key=jax.random.PRNGKey(3))
    # Weights as large as a trained model's (not 0.02), so that the model is far from uniform.
    return jax.tree.map(lambda x: x * 20 if eqx.is_inexact_array(x) else x, model)


def _alone(model, tokens, n_scored, first_position=0):
    """log p(last n_scored tokens | the rest): the request alone in its own sequence, positions from first_position."""
    from levanter.layers.attention import AttentionMask

    Pos = hax.Axis("position", len(tokens) - 1)
    positions = hax.arange(Pos) + first_position
    logits = model(hax.named(jnp.array(tokens[:-1]), Pos), AttentionMask.causal(), pos_ids=positions).array
    log_probs = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(len(tokens) - 1), jnp.array(tokens[1:])]
    return float(log_probs[-n_scored:].sum())


@pytest.mark.slow  # compiles a GPT-2 forward
def test_defect_20_levanter_scores_a_packed_request_at_the_positions_of_the_pack():
    from levanter.data.packing import PromptCompletion, greedy_pack_prompt_completions
    from levanter.eval_harness import _LmEvalHarnessWorker

    model = _tiny_gpt2()
    Batch, Pos = hax.Axis("batch", 1), model.Pos
    first, second = [5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15]  # prompt: 3 and 2 tokens
    packed = greedy_pack_prompt_completions(
        Pos, [PromptCompletion(first, 3, 0), PromptCompletion(second, 2, 1)], pad_token=0
    )
    assert len(packed) == 1, "both requests in one row"
    batch = jax.tree.map(lambda x: hax.stack(Batch, [x]) if isinstance(x, hax.NamedArray) else x, packed[0],
                         is_leaf=lambda x: isinstance(x, hax.NamedArray))
    with one_device_mesh():
        worker = _LmEvalHarnessWorker(Batch, Pos, model, {}, None, None, max_packed_segments=2)
        segments, loglikelihoods, _ = worker.process_loglikelihood(batch)
    scores = dict(zip(segments.array.tolist(), loglikelihoods.array.tolist()))
    assert scores[0] == pytest.approx(_alone(model, first, 2), abs=1e-3)  # first in its row: right
    # The second request is scored at positions 5.. (behind the first), not at 0.. as lm-eval scores it.
    assert abs(scores[1] - _alone(model, second, 4)) > 1e-2
    assert scores[1] == pytest.approx(_alone(model, second, 4, first_position=len(first)), abs=1e-3)


@pytest.mark.slow  # compiles a GPT-2 forward per batch shape
def test_defect_20_workaround_scores_each_request_alone_and_truncates_as_lm_eval():
    from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker

    from levanter_mars.compat import lm_eval_scoring

    model = _tiny_gpt2()
    Batch, Pos = hax.Axis("batch", 2), model.Pos
    long_context = list(range(1, 25))  # 24 + 3 tokens > seq_len 16: lm-eval keeps the last 17, scores 3
    requests = [(("", ""), [5, 6, 7], [8, 9]), (("", ""), [10, 11], [12, 13, 14, 15])]
    requests += [(("", ""), long_context, [30, 31, 29])]
    requests += [(("", ""), [3] * (i + 1), [4, 5]) for i in range(5)]  # more rows than one batch
    with one_device_mesh(), lm_eval_scoring.score_as_lm_eval():
        worker = _LmEvalHarnessWorker(Batch, Pos, model, {}, None, None, max_packed_segments=64)
        results = LevanterHarnessLM(worker)._loglikelihood_tokens(requests)
    for (_, context, continuation), (loglikelihood, _) in zip(requests, results):
        window = (context + continuation)[-(Pos.size + 1):]
        assert loglikelihood == pytest.approx(_alone(model, window, len(continuation)), abs=1e-3)
    # Requests share rows: the first two are packed together.
    arrays, where = lm_eval_scoring.pack_windows(
        [lm_eval_scoring.lm_eval_window(c, x, Pos.size) for _, c, x in requests], Pos.size, 64
    )
    assert where[0][0] == where[1][0] and len(arrays[0]) < len(requests)
