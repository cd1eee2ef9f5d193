"""Defect 3: GPT-2's HF converter without the Hugging Face hub; defect 31: the fields its HF config leaves out."""

from __future__ import annotations

import functools
from typing import Any, Callable


def offline_gpt2_converter(tokenizer: Any) -> Callable[..., Any]:
    """A ``Gpt2Config.hf_checkpoint_converter`` that builds the HF config locally and uses ``tokenizer``.

    Saving (``hf_save_path``) copies ``architectures`` from the reference checkpoint's config; with no reference,
    the stock converter raises, so the offline one supplies GPT-2's own."""
    import transformers
    from levanter.compat.hf_checkpoints import HFCheckpointConverter

    class OfflineHFCheckpointConverter(HFCheckpointConverter):
        @functools.cached_property
        def default_hf_config(self):
            if self.reference_checkpoint is None:
                return transformers.GPT2Config(architectures=["GPT2LMHeadModel"])
            return self.hf_config_from_hf_checkpoint(None)

    def hf_checkpoint_converter(self, ref_checkpoint: str | None = None):
        return OfflineHFCheckpointConverter(
            self.__class__,
            reference_checkpoint=ref_checkpoint,
            HfConfigClass=transformers.GPT2Config,
            tokenizer=tokenizer,
            ignore_prefix="transformer",
        )

    return hf_checkpoint_converter


def hf_converter(model_config: Any, tokenizer: Any):
    """The model's HF converter for ``tokenizer``; GPT-2's without the hub. None for models without one."""
    from levanter.compat.hf_checkpoints import HFCompatConfig
    from levanter.models.gpt2 import Gpt2Config

    if isinstance(model_config, Gpt2Config):
        converter = offline_gpt2_converter(tokenizer)(model_config)
        return converter.with_config_overrides(gpt2_hf_fields_levanter_omits(model_config))
    if isinstance(model_config, HFCompatConfig):
        return model_config.hf_checkpoint_converter().replaced(tokenizer=tokenizer)
    return None


def gpt2_hf_fields_levanter_omits(model_config: Any) -> dict[str, Any]:
    """Defect 31. ``Gpt2Config.to_hf_config`` never passes ``resid_pdrop`` (so an export says transformers' default,
    0.1, whatever was trained: fine-tuning it adds dropout) nor the MLP width (``n_inner``, transformers' default
    4 x ``n_embd``, wrong for another ``mlp_scale``). The export's ``config.json`` gets the trained values."""
    return {"resid_pdrop": model_config.resid_pdrop, "n_inner": model_config.mlp_scale * model_config.hidden_dim}
