"""MARS in Levanter's optimizer registry: ``optimizer: {type: mars-adamw | mars-lion | mars-shampoo | mars-m, ...}``.

Levanter ships its own ``mars`` (global clip, approx only, no 1-D AdamW), so these use new names and never collide
with it. Both learning rates follow Levanter's schedule machinery (warmup, cosine/linear/WSD decay, ``min_lr_ratio``),
and ``learning_rate``, ``learning_rate_1d`` and ``gamma`` are injected hyperparameters, logged as ``optim/<name>``
like Levanter's other optimizers.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Optional

import jax.numpy as jnp
import optax
from levanter.optim import OptimizerConfig

from levanter_mars.optim.hyperparameters import HyperparameterError
from levanter_mars.optim.mars import mars
from levanter_mars.optim.mars_m import mars_m

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
#: ``mars()`` argument -> config field, where the names differ (Levanter's optimizer configs say beta1, epsilon).
_FIELD_OF_ARGUMENT = {"variant": "type", "b1": "beta1", "b2": "beta2", "eps": "epsilon", "b1_1d": "beta1_1d",
                      "b2_1d": "beta2_1d", "b1_adamw": "beta1_adamw", "b2_adamw": "beta2_adamw"}


def _config_field(name: str) -> str:
    return f"optimizer.{_FIELD_OF_ARGUMENT.get(name, name)}"


def _check_by_building(build) -> None:
    """Builds the transformation (no compilation), so that its own checks, the only ones, run as the config is read;
    an error names the config field instead of the argument."""
    try:
        build()
        return
    except HyperparameterError as error:
        message = error.renamed(_config_field)
    # Raised outside the handler: config parsing reports the innermost exception of a chain (__context__ included).
    raise ValueError(message)


def _check_dtypes(config) -> None:
    for name in ("mu_dtype", "prev_dtype"):
        value = getattr(config, name)
        if value is not None and value not in _DTYPES:
            raise ValueError(f"optimizer.{name} must be one of {sorted(_DTYPES)} or null, got {value!r}")
    if not 0.0 <= config.min_lr_ratio <= 1.0:
        raise ValueError(f"optimizer.min_lr_ratio must be in [0, 1], got {config.min_lr_ratio!r}")


def _dtype(name: Optional[str]):
    return None if name is None else _DTYPES[name]


@dataclass(frozen=True)
class MarsFamilyConfig(OptimizerConfig, abc.ABC):
    """Fields every MARS-family optimizer (MARS and MARS-M) has: the correction's mode and the buffers' dtypes."""

    exact: bool = False
    """Exact correction: an extra forward/backward at the previous parameters on the current batch."""
    max_grad_norm: Optional[float] = 1.0
    """Global-norm clip of raw gradients (and, in exact mode, of the previous-parameter gradient)."""
    mu_dtype: Optional[str] = None
    """float32 | bfloat16 | float16 for the first moment; None keeps the parameter dtype."""
    prev_dtype: Optional[str] = None
    """float32 | bfloat16 | float16 for the stored previous gradient (approx) or parameters (exact)."""

    def __post_init__(self):
        _check_dtypes(self)


@dataclass(frozen=True)
class MarsOptimizerConfig(MarsFamilyConfig, abc.ABC):
    """Fields shared by the three MARS instantiations. Defaults are the paper's GPT-2 small recipe."""

    variant: ClassVar[str]

    learning_rate: float = 6e-3
    learning_rate_1d: Optional[float] = None
    """Peak learning rate of the AdamW branch (vector tensors); None means learning_rate / 2, the paper's recipe."""
    weight_decay: float = 1e-2
    """Decay of Linear weights. Embeddings never decay (Levanter's default mask), as in the reference."""
    weight_decay_1d: float = 0.1
    """Decay of the AdamW-branch tensors, applied to all of them, as in the reference."""
    beta1: float = 0.95
    beta2: float = 0.99
    beta1_1d: float = 0.9
    beta2_1d: float = 0.95
    epsilon: float = 1e-8
    gamma: float = 0.025
    """Strength of the variance-reduction correction."""
    optimize_1d: bool = False
    """Run vector tensors through MARS instead of the separate AdamW."""
    amsgrad: bool = False
    """Divide the AdamW directions (MARS-AdamW's and the 1-D AdamW's) by the running maximum of the second moment, as
    the reference's ``amsgrad``; one more buffer per such tensor."""

    def __post_init__(self):
        super().__post_init__()
        _check_by_building(lambda: self._mars(self.learning_rate, self.learning_rate_1d, self.gamma))

    @property
    def peak_learning_rate_1d(self) -> float:
        return self.learning_rate / 2 if self.learning_rate_1d is None else self.learning_rate_1d

    def _mars(self, learning_rate, learning_rate_1d, gamma) -> optax.GradientTransformationExtraArgs:
        return mars(
            learning_rate,
            variant=self.variant,
            b1=self.beta1,
            b2=self.beta2,
            eps=self.epsilon,
            gamma=gamma,
            weight_decay=self.weight_decay,
            weight_decay_mask=self.build_weight_decay_mask(),
            exact=self.exact,
            optimize_1d=self.optimize_1d,
            learning_rate_1d=learning_rate_1d,
            b1_1d=self.beta1_1d,
            b2_1d=self.beta2_1d,
            weight_decay_1d=self.weight_decay_1d,
            mu_dtype=_dtype(self.mu_dtype),
            prev_dtype=_dtype(self.prev_dtype),
            max_grad_norm=self.max_grad_norm,
            amsgrad=self.amsgrad,
        )

    def build(self, num_train_steps: int) -> optax.GradientTransformationExtraArgs:
        return optax.inject_hyperparams(self._mars)(
            learning_rate=self.lr_scheduler(num_train_steps),
            learning_rate_1d=self.lr_scheduler(num_train_steps, override_lr=self.peak_learning_rate_1d),
            gamma=self.gamma,
        )


@OptimizerConfig.register_subclass("mars-adamw")
@dataclass(frozen=True)
class MarsAdamWConfig(MarsOptimizerConfig):
    """MARS-AdamW: the paper's main instantiation."""

    variant: ClassVar[str] = "adamw"


@OptimizerConfig.register_subclass("mars-lion")
@dataclass(frozen=True)
class MarsLionConfig(MarsOptimizerConfig):
    """MARS-Lion: sign of the MARS momentum. Tune its learning rate separately (about 10x below MARS-AdamW)."""

    variant: ClassVar[str] = "lion"
    learning_rate: float = 6e-4


@OptimizerConfig.register_subclass("mars-shampoo")
@dataclass(frozen=True)
class MarsShampooConfig(MarsOptimizerConfig):
    """MARS-Shampoo: Newton-Schulz-orthogonalized MARS momentum for matrices."""

    variant: ClassVar[str] = "shampoo"


@OptimizerConfig.register_subclass("mars-m")
@dataclass(frozen=True)
class MarsMConfig(MarsFamilyConfig):
    """MARS-M (:func:`levanter_mars.optim.mars_m`). Defaults are the official GPT-2 small config.

    One learning rate and one weight decay for every tensor, as in the official trainer: Linear weights take the
    MARS-M update, embeddings, the LM head and 1-D tensors AdamW, and all of them decay.
    """

    learning_rate: float = 6e-3
    weight_decay: float = 1e-2
    beta1: float = 0.95
    """MARS-M momentum."""
    gamma: float = 0.025
    """Strength of the variance-reduction correction; 0 gives Muon (Moonlight's form, no Nesterov)."""
    beta1_adamw: float = 0.9
    beta2_adamw: float = 0.95
    epsilon: float = 1e-8
    """AdamW epsilon, added to sqrt(v) before the bias correction as in the official trainer."""
    ns_steps: int = 5
    efficient: bool = False
    """Memory-efficient form: no previous-gradient buffer and no clip (Muon's state). Not with exact."""

    def __post_init__(self):
        super().__post_init__()
        for name in ("weight_decay_modules", "default_weight_decay_mask"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"optimizer.{name} is not supported by mars-m: it decays every tensor with weight_decay, as the "
                    f"official trainer does; got {getattr(self, name)!r}"
                )
        _check_by_building(lambda: self._mars_m(self.learning_rate, self.gamma))

    def _mars_m(self, learning_rate, gamma) -> optax.GradientTransformationExtraArgs:
        return mars_m(
            learning_rate,
            b1=self.beta1,
            gamma=gamma,
            weight_decay=self.weight_decay,
            exact=self.exact,
            efficient=self.efficient,
            ns_steps=self.ns_steps,
            b1_adamw=self.beta1_adamw,
            b2_adamw=self.beta2_adamw,
            eps=self.epsilon,
            mu_dtype=_dtype(self.mu_dtype),
            prev_dtype=_dtype(self.prev_dtype),
            max_grad_norm=self.max_grad_norm,
        )

    def build(self, num_train_steps: int) -> optax.GradientTransformationExtraArgs:
        return optax.inject_hyperparams(self._mars_m)(learning_rate=self.lr_scheduler(num_train_steps), gamma=self.gamma)


#: The MARS instantiations (sharing :class:`MarsOptimizerConfig`'s fields); MARS-M is registered as ``mars-m``.
MARS_OPTIMIZER_TYPES = {"mars-adamw": MarsAdamWConfig, "mars-lion": MarsLionConfig, "mars-shampoo": MarsShampooConfig}

__all__ = [
    "MARS_OPTIMIZER_TYPES",
    "MarsFamilyConfig",
    "MarsAdamWConfig",
    "MarsLionConfig",
    "MarsMConfig",
    "MarsOptimizerConfig",
    "MarsShampooConfig",
]

