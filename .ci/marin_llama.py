"""Marin's Levanter (marin-levanter) trains its Llama with our optimizers, by name, through its own Trainer.

Each ``optimizer:`` block is parsed from YAML by draccus against Levanter's ``OptimizerConfig`` (``mars-adamw`` and
``mars-m`` are registered by ``import levanter_mars.optim.levanter_config``, as a Marin user registers them), built
with Levanter's schedule, and run for a few steps of Levanter's ``Trainer`` on a fixed batch of synthetic tokens.
Exits 1 unless every loss is finite and the last is below the first. Run by .ci/marin in the marin venv:
``python .ci/marin_llama.py``.
"""

from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import dataclass

import draccus
import haliax as hax
import jax
import jax.numpy as jnp
from levanter.checkpoint import CheckpointerConfig
from levanter.models.llama import LlamaConfig
from levanter.models.lm_model import LmExample
from levanter.optim import OptimizerConfig
from levanter.tracker.tracker import NoopConfig
from levanter.trainer import Trainer, TrainerConfig

import levanter_mars.optim.levanter_config  # noqa: F401  (registers mars-adamw, mars-lion, mars-shampoo, mars-m)

STEPS = 8
BATCH, SEQ, VOCAB = 8, 32, 128
OPTIMIZERS = {
    "mars-adamw": "optimizer:\n  type: mars-adamw\n  learning_rate: 3e-3\n  learning_rate_1d: 3e-3\n  warmup: 0.0\n",
    "mars-m": "optimizer:\n  type: mars-m\n  learning_rate: 3e-3\n  warmup: 0.0\n",
}


@dataclass
class OptimizerSection:
    optimizer: OptimizerConfig


def synthetic_batch(Batch: hax.Axis, Pos: hax.Axis) -> LmExample:
    """A learnable sequence: each row counts up by one from a random start (mod the vocabulary)."""
    starts = jax.random.randint(jax.random.PRNGKey(0), (Batch.size, 1), 0, VOCAB)
    tokens = hax.named((starts + jnp.arange(Pos.size)[None, :]) % VOCAB, (Batch, Pos))
    return hax.vmap(LmExample.causal, Batch)(tokens)


def train(name: str, yaml_text: str, checkpoints: str) -> list[float]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(yaml_text)
        f.flush()
        optimizer_config = draccus.parse(OptimizerSection, config_path=f.name, args=[]).optimizer
    assert optimizer_config.__module__ == "levanter_mars.optim.levanter_config", type(optimizer_config)
    trainer_config = TrainerConfig(
        num_train_steps=STEPS, train_batch_size=BATCH, tracker=NoopConfig(), log_jaxprs=False, log_xla_hlo=False,
        id=f"marin-{name}", checkpointer=CheckpointerConfig(base_path=checkpoints),
    )
    model_config = LlamaConfig(max_seq_len=SEQ, hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2,
                               num_kv_heads=2)
    Vocab, Pos = hax.Axis("vocab", VOCAB), hax.Axis("position", SEQ)
    optimizer = optimizer_config.build(STEPS)

    def loss_fn(model, example, **kwargs):
        return model.compute_next_token_loss(example, **kwargs)

    losses = []
    with Trainer(trainer_config, optimizer, loss_fn) as trainer:
        state = trainer.initial_state(jax.random.PRNGKey(1), model_init=lambda: model_config.build(Vocab, key=jax.random.PRNGKey(2)))
        example = synthetic_batch(trainer.TrainBatch, Pos)
        for _ in range(STEPS):
            info = trainer.train_step(state, example)
            state = info.state
            losses.append(float(info.loss))
    return losses


def main() -> int:
    failed = []
    with tempfile.TemporaryDirectory() as checkpoints:
        for name, yaml_text in OPTIMIZERS.items():
            losses = train(name, yaml_text, checkpoints)
            ok = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
            print(f"{name}: losses {' '.join(f'{x:.4f}' for x in losses)} -> {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                failed.append(name)
    print(f"marin-levanter Llama: {len(OPTIMIZERS) - len(failed)}/{len(OPTIMIZERS)} optimizers train")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
