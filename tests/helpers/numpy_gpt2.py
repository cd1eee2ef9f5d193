"""An independent reference for the eval harness: GPT-2 in plain numpy (float64) from an HF export's safetensors,
behind lm-eval's own request handling (``TemplateLM``), scored as lm-eval's ``hf`` backend scores.

Not Levanter's model code, and not ours: the forward follows Hugging Face's ``GPT2LMHeadModel`` (pre-LayerNorm
blocks, fused QKV ``Conv1D`` weights stored (in, out), tanh GELU, tied output embedding); ``_loglikelihood_tokens``
follows ``lm_eval/models/huggingface.py`` (input = the last ``max_length + 1`` tokens but the last; the
continuation's log-probabilities are read off the last ``len(continuation)`` positions). torch is not a dependency
(its PyPI wheels bring CUDA libraries: gigabytes), so lm-eval's ``hf`` backend itself cannot run in CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from lm_eval.api.model import TemplateLM
from safetensors.numpy import load_file


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


class NumpyGpt2:
    def __init__(self, hf_dir: Path):
        self.config = json.loads((Path(hf_dir) / "config.json").read_text())
        assert self.config.get("activation_function", "gelu_new") == "gelu_new", self.config
        assert not self.config.get("scale_attn_by_inverse_layer_idx") and not self.config.get("reorder_and_upcast_attn")
        weights = {}
        for path in sorted(Path(hf_dir).glob("*.safetensors")):
            weights.update(load_file(str(path)))
        self.w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in weights.items()}
        self.max_length = int(self.config["n_positions"])

    def logits(self, tokens: list[int]) -> np.ndarray:
        w, c = self.w, self.config
        eps, heads = c["layer_norm_epsilon"], c["n_head"]
        n = len(tokens)
        x = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(n)]
        causal = np.triu(np.full((n, n), -np.inf), k=1)
        for i in range(c["n_layer"]):
            p = f"h.{i}."
            a = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            q, k, v = np.split(a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"], 3, axis=-1)
            q, k, v = (t.reshape(n, heads, -1).transpose(1, 0, 2) for t in (q, k, v))
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]) + causal
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attended = (scores / scores.sum(-1, keepdims=True)) @ v
            x = x + attended.transpose(1, 0, 2).reshape(n, -1) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            m = _layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            m = _gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
            x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
        return x @ w["wte.weight"].T


class NumpyGpt2LM(TemplateLM):
    """lm-eval model: TemplateLM splits each request (as for every lm-eval backend); the numpy forward scores it."""

    def __init__(self, hf_dir: Path):
        from transformers import AutoTokenizer

        super().__init__()
        self.model = NumpyGpt2(hf_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        # As HFLM.tok_encode for a model without add_bos_token: the tokenizer's own default.
        return self.tokenizer.encode(string) if add_special_tokens is None else self.tokenizer.encode(
            string, add_special_tokens=add_special_tokens
        )

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        out = []
        for _, context, continuation in requests:
            inputs = (context + continuation)[-(self.model.max_length + 1) :][:-1]
            logits = self.model.logits(inputs)[len(inputs) - len(continuation) :]
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            ll = float(log_probs[np.arange(len(continuation)), continuation].sum())
            out.append((ll, bool((logits.argmax(-1) == np.array(continuation)).all())))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


def reference_results(hf_dir: Path, task: str, task_dir: Path) -> dict:
    """lm-eval's ``evaluate`` of ``task`` (a local task YAML in ``task_dir``) on the numpy model, with samples.
    Run from the repository root (the task's data path is relative to it)."""
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager, get_task_dict

    tasks = get_task_dict([task], TaskManager(include_path=[str(task_dir)], include_defaults=False))
    return evaluator.evaluate(NumpyGpt2LM(hf_dir), tasks, log_samples=True, bootstrap_iters=0)
