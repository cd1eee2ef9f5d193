"""MARS and MARS-M as named-axis optax transformations. They need only jax, optax, equinox and haliax: importing this
package imports no Levanter. Levanter's optimizer configs (``mars-adamw``, ``mars-lion``, ``mars-shampoo``,
``mars-m``) are registered by ``import levanter_mars.optim.levanter_config``, which our entry points do."""

from levanter_mars.optim.dimension_numbers import MuonDimensionNumbers
from levanter_mars.optim.hyperparameters import HyperparameterError, validate_mars_hyperparameters
from levanter_mars.optim.mars import mars, mars_param_labels, scale_by_mars
from levanter_mars.optim.mars_family import ScaleByMarsState
from levanter_mars.optim.mars_m import mars_m, mars_m_roles, scale_by_mars_m
from levanter_mars.optim.newton_schulz import newton_schulz5
from levanter_mars.optim.objective import DifferentiableObjective, objective_gradient
from levanter_mars.optim.tensor_roles import (
    TensorKind,
    TensorRole,
    describe_roles,
    register_expert_axis_name,
    register_tensor_role_rule,
    tensor_roles,
)

__all__ = [
    "DifferentiableObjective",
    "MuonDimensionNumbers",
    "HyperparameterError",
    "ScaleByMarsState",
    "TensorKind",
    "TensorRole",
    "describe_roles",
    "mars",
    "mars_m",
    "mars_m_roles",
    "mars_param_labels",
    "newton_schulz5",
    "objective_gradient",
    "register_expert_axis_name",
    "register_tensor_role_rule",
    "scale_by_mars",
    "scale_by_mars_m",
    "tensor_roles",
    "validate_mars_hyperparameters",
]
