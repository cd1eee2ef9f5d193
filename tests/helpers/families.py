"""Every language-model family the pinned Levanter ships, as tiny configs: for the role audit, the torch-view checks
and the family x optimizer matrix (scripts/family_matrix.py)."""

from __future__ import annotations

import dataclasses

from levanter.models.lm_model import LmConfig

#: ``model:`` sections (YAML-ready) of a tiny model per family; grouped-query attention wherever the family has it.
TINY_MODELS = {
    "gpt2": {"type": "gpt2", "hidden_dim": 32, "num_layers": 2, "num_heads": 2},
    "llama": {"type": "llama", "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2, "num_heads": 4,
              "num_kv_heads": 2},
    "mistral": {"type": "mistral", "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2, "num_heads": 4,
                "num_kv_heads": 2},
    "qwen": {"type": "qwen", "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2, "num_heads": 4,
             "num_kv_heads": 2},
    "gemma": {"type": "gemma", "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2, "num_heads": 4,
              "num_kv_heads": 2},
    "olmo2": {"type": "olmo2", "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2, "num_heads": 4,
              "num_kv_heads": 2},
    "mixtral": {"type": "mixtral", "hidden_dim": 32, "intermediate_dim": 32, "num_layers": 2, "num_heads": 4,
                "num_kv_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2},
}
#: The other LM types Levanter registers, audited too (the issue's seven families are TINY_MODELS).
MORE_TINY_MODELS = {
    "qwen3": dict(TINY_MODELS["qwen"], type="qwen3"),
    "gemma2": dict(TINY_MODELS["gemma"], type="gemma2"),
    "gemma3": dict(TINY_MODELS["gemma"], type="gemma3"),
}


def model_config(section: dict, seq_len: int = 32) -> LmConfig:
    """The Levanter config of a ``model:`` section (without the CLI)."""
    cls = LmConfig.get_choice_class(section["type"])
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in section.items() if k != "type"}
    kwargs["seq_len"] = seq_len
    if "gradient_checkpointing" in fields:
        kwargs["gradient_checkpointing"] = False
    return cls(**kwargs)
