"""Defect 3: GPT-2's HF converter without the Hugging Face hub."""

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
        return offline_gpt2_converter(tokenizer)(model_config)
    if isinstance(model_config, HFCompatConfig):
        return model_config.hf_checkpoint_converter().replaced(tokenizer=tokenizer)
    return None
