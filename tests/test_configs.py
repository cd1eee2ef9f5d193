"""Every shipped training config parses, and the GPT-2 recipe configs have the paper's sizes and settings."""

import os
from pathlib import Path

import equinox as eqx
import haliax as hax
import jax
import pytest

from levanter_mars.program_config import parse_train_config
from levanter_mars.training.config import ConfigError
from levanter_mars.training.validation import check_placeholders

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
TRAIN_CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
SIZES = {"small": 124e6, "medium": 355e6, "large": 774e6, "xl": 1.56e9}


def _parse(path: Path):
    return parse_train_config(["--config_path", str(path)])


def test_the_recipe_configs_exist():
    names = {p.name for p in TRAIN_CONFIGS}
    for size in SIZES:
        assert f"gpt2_{size}_mars.yaml" in names and f"gpt2_{size}_adamw.yaml" in names
        assert f"gpt2_{size}_mars_m.yaml" in names
    for example in ("exact", "lion", "shampoo"):
        assert f"gpt2_small_mars_{example}.yaml" in names
    assert "gpt2_nano_mars_m.yaml" in names
    assert (CONFIG_DIR / "data" / "fineweb_edu.yaml").exists()


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_config_parses(path):
    config = _parse(path)
    assert config.trainer.id, "every shipped config names its run, so rerunning it resumes"


@pytest.mark.parametrize("size", sorted(SIZES))
def test_gpt2_parameter_counts_are_within_one_percent(size):
    config = _parse(CONFIG_DIR / f"gpt2_{size}_mars.yaml")
    shapes = eqx.filter_eval_shape(config.model.build, hax.Axis("vocab", 50257), key=jax.random.PRNGKey(0))
    count = sum(x.size for x in jax.tree.leaves(shapes) if hasattr(x, "size"))
    assert abs(count / SIZES[size] - 1) < 0.01, f"{size}: {count / 1e6:.1f}M"


@pytest.mark.parametrize("size", sorted(SIZES))
def test_paper_recipe(size):
    mars = _parse(CONFIG_DIR / f"gpt2_{size}_mars.yaml")
    adamw = _parse(CONFIG_DIR / f"gpt2_{size}_adamw.yaml")
    expected_lr = {"small": 6e-3, "medium": 3e-3, "large": 2e-3, "xl": 2e-3}[size]
    assert mars.optimizer.learning_rate == pytest.approx(expected_lr)
    assert mars.optimizer.peak_learning_rate_1d == pytest.approx(expected_lr / 2)
    assert (mars.optimizer.beta1, mars.optimizer.beta2, mars.optimizer.gamma) == (0.95, 0.99, 0.025)
    assert mars.optimizer.weight_decay == pytest.approx(1e-2)
    assert adamw.optimizer.learning_rate == pytest.approx(expected_lr / 10)
    assert (adamw.optimizer.beta1, adamw.optimizer.beta2, adamw.optimizer.weight_decay) == (0.9, 0.95, 0.1)
    for config in (mars, adamw):
        assert config.trainer.train_batch_size == 480 and config.model.seq_len == 1024
        assert config.trainer.num_train_steps == 100_000 and config.optimizer.warmup == 2000
        assert config.optimizer.max_grad_norm == 1.0 and config.optimizer.lr_schedule == "cosine"
        assert config.data.configs["fineweb_edu"].id == "HuggingFaceFW/fineweb-edu"
        assert config.data.num_validation_sequences["fineweb_edu"] > 0
    min_lr = {"small": 3e-5, "medium": 6e-5, "large": 1e-5, "xl": 1e-5}[size]
    assert mars.optimizer.learning_rate * mars.optimizer.min_lr_ratio == pytest.approx(min_lr)
    assert adamw.optimizer.learning_rate * adamw.optimizer.min_lr_ratio == pytest.approx(min_lr)


@pytest.mark.parametrize("size", sorted(SIZES))
def test_official_mars_m_recipe(size):
    """AGI-Arena/MARS MARS_M/config/train_gpt2_<size>_mars_m.py, on the model and trainer of our MARS config."""
    mars_m = _parse(CONFIG_DIR / f"gpt2_{size}_mars_m.yaml")
    mars = _parse(CONFIG_DIR / f"gpt2_{size}_mars.yaml")
    optimizer = mars_m.optimizer
    assert type(optimizer).__name__ == "MarsMConfig"
    assert optimizer.learning_rate == pytest.approx({"small": 6e-3, "medium": 5e-3, "large": 5e-3, "xl": 3e-3}[size])
    min_lr = {"small": 3e-5, "medium": 6e-5, "large": 1e-5, "xl": 1e-5}[size]
    assert optimizer.learning_rate * optimizer.min_lr_ratio == pytest.approx(min_lr, rel=1e-6)
    assert (optimizer.weight_decay, optimizer.beta1, optimizer.gamma) == (1e-2, 0.95, 0.025)
    assert (optimizer.beta1_adamw, optimizer.beta2_adamw, optimizer.ns_steps) == (0.9, 0.95, 5)
    assert not optimizer.exact and not optimizer.efficient
    assert optimizer.warmup == 2000 and optimizer.max_grad_norm == 1.0 and optimizer.lr_schedule == "cosine"
    assert mars_m.model == mars.model and mars_m.trainer.num_train_steps == 100_000
    assert mars_m.trainer.train_batch_size == mars.trainer.train_batch_size == 480
    assert mars_m.trainer.id == f"gpt2-{size}-mars-m"


def test_nano_mars_m_is_the_embedded_default_with_mars_m():
    nano = _parse(CONFIG_DIR / "gpt2_nano_mars.yaml")
    nano_m = _parse(CONFIG_DIR / "gpt2_nano_mars_m.yaml")
    assert type(nano_m.optimizer).__name__ == "MarsMConfig"
    assert nano_m.model == nano.model and nano_m.data == nano.data
    assert nano_m.trainer.num_train_steps == nano.trainer.num_train_steps and nano_m.trainer.id != nano.trainer.id


@pytest.mark.parametrize("size", sorted(SIZES))
def test_sizing_divides_the_batch(size):
    """The stated slice (see each file's header) must give a whole number of sequences per data shard."""
    config = _parse(CONFIG_DIR / f"gpt2_{size}_mars.yaml")
    chips = {"small": 16, "medium": 32, "large": 64, "xl": 64}[size]
    data_shards = chips // config.trainer.model_axis_size
    assert config.trainer.train_batch_size % data_shards == 0
    assert config.trainer.train_batch_size // data_shards == config.trainer.per_device_parallelism
    for axis in config.trainer.tensor_parallel_axes or []:
        size_of = {"heads": config.model.num_heads, "mlp": 4 * config.model.hidden_dim}[axis]
        assert size_of % config.trainer.model_axis_size == 0, axis


def test_placeholder_buckets_are_refused():
    with pytest.raises(ConfigError, match="data.cache_dir is still the placeholder"):
        check_placeholders(_parse(CONFIG_DIR / "gpt2_small_mars.yaml"))


def test_an_offline_wandb_tracker_puts_wandb_mode_in_the_environment(monkeypatch):
    # wandb-core resolved api.forge.coreweave.com at the end of a `mode: offline` run (the nano config's) unless
    # WANDB_MODE was set: the offline mode must reach wandb-core's environment too.
    import os

    from levanter_mars.compat.tracking import wandb_offline_unless_configured

    repo = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("WANDB_MODE", "set so that monkeypatch restores it")
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = parse_train_config(["--config_path", str(repo / "config" / "gpt2_nano_mars.yaml")])
    assert config.trainer.tracker.mode == "offline"
    wandb_offline_unless_configured(config.trainer)
    assert os.environ["WANDB_MODE"] == "offline"
    # An explicit WANDB_MODE is left alone.
    monkeypatch.setenv("WANDB_MODE", "online")
    nano = parse_train_config(["--config_path", str(repo / "config" / "gpt2_nano_mars.yaml")])
    wandb_offline_unless_configured(nano.trainer)
    assert os.environ["WANDB_MODE"] == "online"


def test_fresh_twice_in_one_second_keeps_both_old_runs(tmp_path, monkeypatch):
    import datetime

    from levanter_mars.training.run import fresh

    class FrozenClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 1, 12, 0, 0)

    from levanter_mars.program_config import parse_train_config
    from tests.helpers.training import tiny_config

    monkeypatch.setattr(fresh.datetime, "datetime", FrozenClock)
    config = parse_train_config(["--config_path", str(tiny_config(tmp_path, tmp_path / "corpus", "run"))])
    target = tmp_path / "runs" / "run"
    moved = []
    for content in ("first", "second"):
        target.mkdir(parents=True)
        (target / "metrics.jsonl").write_text(content)
        (moved_now,) = fresh.set_aside_run(config, {})
        moved.append(moved_now)
    assert len(set(moved)) == 2 and not target.exists()
    assert [open(os.path.join(m, "metrics.jsonl")).read() for m in moved] == ["first", "second"]
