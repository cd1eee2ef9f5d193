"""Defects of the pinned Levanter's models and their HF export that ``levanter_mars.compat.levanter_models``
works around."""

import inspect
import json

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import pytest

from levanter_mars.compat import levanter_models


def _word_level_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="<eos>")), eos_token="<eos>"
    )


def test_defect_3_gpt2_converter_needs_the_hub_and_the_workaround_does_not():
    from levanter.models.gpt2 import Gpt2Config

    source = inspect.getsource(Gpt2Config.hf_checkpoint_converter)
    assert 'reference_checkpoint="gpt2"' in source
    with pytest.raises(Exception):
        Gpt2Config().hf_checkpoint_converter()  # offline (HF_HUB_OFFLINE=1 and no network in tests)

    tokenizer = _word_level_tokenizer()
    converter = levanter_models.hf_converter(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1), tokenizer)
    assert converter.reference_checkpoint is None
    assert converter.tokenizer is tokenizer


def test_defect_3_an_hf_export_needs_the_reference_config_and_the_workaround_supplies_it():
    from levanter.compat.hf_checkpoints import HFCheckpointConverter
    from levanter.models.gpt2 import Gpt2Config
    import transformers

    tokenizer = _word_level_tokenizer()
    # What saving (hf_save_path) reads: the reference checkpoint's config, for "architectures".
    stock = HFCheckpointConverter(
        Gpt2Config, reference_checkpoint=None, HfConfigClass=transformers.GPT2Config, tokenizer=tokenizer
    )
    with pytest.raises(ValueError, match="Must provide a reference checkpoint"):
        stock.default_hf_config
    offline = levanter_models.hf_converter(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1), tokenizer)
    assert offline.default_hf_config.architectures == ["GPT2LMHeadModel"]


def test_defect_31_levanters_gpt2_hf_config_omits_resid_pdrop_and_the_mlp_width():
    from levanter.models.gpt2 import Gpt2Config

    hf = Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1, resid_pdrop=0.0, mlp_scale=2).to_hf_config(100)
    assert hf.resid_pdrop == 0.1, "transformers' default, not the trained 0.0"
    assert hf.n_inner is None  # read as 4 x n_embd = 128, not the trained 2 x 32


def test_defect_31_workaround_the_export_config_json_holds_what_was_trained(tmp_path):
    """Every field of an export's config.json that describes the model, read back by transformers, against the
    trained Levanter config (non-default values wherever the field allows)."""
    import transformers
    from levanter.models.gpt2 import Gpt2Config, Gpt2LMHeadModel

    tokenizer = _word_level_tokenizer()
    trained = Gpt2Config(
        seq_len=64, hidden_dim=32, num_heads=2, num_layers=3, mlp_scale=2, initializer_range=0.03,
        embed_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-6,
        scale_attn_by_inverse_layer_idx=True, upcast_attn=True,
    )  # fmt: skip
    Vocab = hax.Axis("vocab", len(tokenizer))
    model = Gpt2LMHeadModel.init(Vocab, trained, key=jax.random.PRNGKey(0))
    converter = levanter_models.hf_converter(trained, tokenizer)
    with jax.set_mesh(jax.sharding.Mesh(jax.devices()[:1], ("data",))):  # as the trainer's export hook runs
        converter.save_pretrained(model, str(tmp_path), save_reference_code=False)
    exported = transformers.GPT2Config.from_pretrained(str(tmp_path))
    expected = {
        "vocab_size": len(tokenizer), "n_positions": 64, "n_embd": 32, "n_head": 2, "n_layer": 3, "n_inner": 64,
        "initializer_range": 0.03, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-6, "activation_function": "gelu_new", "scale_attn_by_inverse_layer_idx": True,
        "reorder_and_upcast_attn": True, "architectures": ["GPT2LMHeadModel"],
    }  # fmt: skip
    assert {k: getattr(exported, k) for k in expected} == expected


def _trainer_like_mesh():
    """One device, Auto axes, as Levanter's Trainer builds its mesh (``jax.sharding.Mesh``) on every jax.

    ``jax.make_mesh``'s default axis type was Auto on jax 0.7.2 and is Explicit on 0.9.2, under which Mixtral's
    ``ragged_dot_general`` has no sharding rule: the axis type is stated, not left to the jax version."""
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen", "gemma", "olmo2", "mixtral"])
def test_defect_33_family_converters_need_the_hub_and_the_workaround_does_not(family, tmp_path):
    from haliax.partitioning import set_mesh
    from levanter.models.lm_model import LmConfig

    config = LmConfig.get_choice_class(family)(
        hidden_dim=32, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=1, seq_len=16
    )
    with pytest.raises(Exception):
        config.hf_checkpoint_converter()  # loads the reference checkpoint's tokenizer (offline in tests)

    tokenizer = _word_level_tokenizer()
    converter = levanter_models.hf_converter(config, tokenizer)
    assert converter.reference_checkpoint is None and converter.tokenizer is tokenizer
    model = config.build(hax.Axis("vocab", len(tokenizer)), key=jax.random.PRNGKey(0))
    with set_mesh(_trainer_like_mesh()):
        converter.save_pretrained(model, str(tmp_path), save_tokenizer=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [converter.default_hf_config.architectures[0]]
    assert saved["architectures"][0].endswith("ForCausalLM") and saved["vocab_size"] == len(tokenizer)


def test_defect_33_a_family_without_a_converter_is_refused_by_name():
    from levanter.models.gpt2_hyena import Gpt2HyenaConfig

    assert "no HF converter for Gpt2HyenaConfig" in levanter_models.hf_export_refusal(Gpt2HyenaConfig())
    assert levanter_models.hf_converter(Gpt2HyenaConfig(), _word_level_tokenizer()) is None


@pytest.mark.slow  # compiles a Mixtral gradient
def test_defect_34_mixtral_loss_cannot_be_differentiated_and_the_workaround_can(monkeypatch):
    from haliax.partitioning import set_mesh
    from levanter.models import loss as levanter_loss

    from levanter_mars.compat import levanter_loss as loss_fix
    from levanter.models.lm_model import LmExample, compute_next_token_loss
    from levanter.models.mixtral import MixtralConfig
    import levanter.tracker
    from levanter.tracker import NoopTracker

    config = MixtralConfig(hidden_dim=16, intermediate_dim=16, num_layers=1, num_heads=2, num_kv_heads=1, seq_len=8,
                           n_routed_experts=2, num_experts_per_tok=1, use_flash_attention=False)
    model = config.build(hax.Axis("vocab", 11), key=jax.random.PRNGKey(0))
    tokens = hax.named(jnp.arange(8) % 11, config.Pos)
    example = LmExample.causal(tokens)

    def grad_of(loss_fn):
        return eqx.filter_grad(lambda m: loss_fn(m, example, key=None).scalar())(model)

    levanter.tracker.set_global_tracker(NoopTracker())
    for name in loss_fix.MASKED_LOSSES:  # put back after the test, however it leaves them
        monkeypatch.setattr(levanter_loss, name, getattr(levanter_loss, name))
    loss_fix.boolean_loss_masks()  # as the stack does (defect 7): jax >= 0.8 rejects the float mask before the JVP
    with set_mesh(_trainer_like_mesh()):
        with pytest.raises(ValueError, match="IO callbacks do not support JVP"):
            grad_of(compute_next_token_loss)
        grads = grad_of(levanter_models.differentiable_loss(compute_next_token_loss))
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
