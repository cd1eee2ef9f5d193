"""The optimizers the speed benchmarks compare, built the same way for the update and the train-step benchmarks.

* ``adamw``: optax AdamW (b1 0.9, b2 0.95, wd 0.1) after a global-norm clip at 1.0, Levanter's ``adam`` recipe.
* ``levanter-mars``: Levanter's own ``MarsConfig`` (approx only, one global clip).
* ``mars-<variant>-<approx|exact>-<fp32|bf16>``: ours, :func:`levanter_mars.optim.mars`, with the paper's
  hyperparameters, the global clip at 1.0 and ``mu_dtype``/``prev_dtype`` in fp32 or bf16 (nu stays fp32).
* ``mars-m-<approx|exact|efficient>-fp32``: :func:`levanter_mars.optim.mars_m` with the official GPT-2 small recipe.
* ``muon-fp32``: the Muon baseline, ``mars_m(gamma=0, efficient=True)``: Moonlight's Muon without Nesterov (NS5 of
  the momentum for Linear weights, AdamW for embeddings, the head and 1-D tensors), with Muon's state.
* ``<one of ours>@<git ref>``: the same optimizer as of an earlier commit (:mod:`levanter_mars.bench.baseline`).

All use a constant learning rate, so no schedule is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp
import optax

from levanter_mars.compat.levanter_optimizers import jax_tree_map_restored
from levanter_mars.optim.guard import skip_nonfinite_updates

ADAMW = "adamw"
LEVANTER_MARS = "levanter-mars"
VARIANTS = ("adamw", "lion", "shampoo")
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class OptimizerCase:
    name: str
    build: Callable[[], optax.GradientTransformation]
    exact: bool = False
    description: str = ""

    def tracing(self) -> contextlib.AbstractContextManager:
        """Context in which the optimizer must be built and traced."""
        return jax_tree_map_restored() if self.name == LEVANTER_MARS else contextlib.nullcontext()  # defect 8


def _adamw() -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(6e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))


def _levanter_mars() -> optax.GradientTransformation:
    from levanter.optim.mars import MarsConfig

    return MarsConfig(learning_rate=6e-3, weight_decay=0.01, warmup=0.0, max_grad_norm=1.0).build(1000)


def _optim(baseline_ref: Optional[str]) -> Any:
    """``levanter_mars.optim``: this checkout's, or the one of git ``baseline_ref`` (:mod:`.baseline`)."""
    if baseline_ref is None:
        import levanter_mars.optim as optim

        return optim
    from levanter_mars.bench.baseline import load_optim

    return load_optim(baseline_ref)


def _ours(variant: str, exact: bool, dtype: Any, ref: Optional[str]) -> Callable[[], optax.GradientTransformation]:
    def build() -> optax.GradientTransformation:
        return _optim(ref).mars(
            6e-3, variant=variant, exact=exact, weight_decay=0.01, max_grad_norm=1.0, mu_dtype=dtype, prev_dtype=dtype
        )

    return build


MARS_M_MODES = {"approx": {}, "exact": {"exact": True}, "efficient": {"efficient": True}}
MUON = "muon-fp32"


def _mars_m(ref: Optional[str], **mode: Any) -> Callable[[], optax.GradientTransformation]:
    def build() -> optax.GradientTransformation:
        return _optim(ref).mars_m(6e-3, weight_decay=0.01, max_grad_norm=1.0, **mode)

    return build


def ours_name(variant: str, exact: bool, dtype_name: str) -> str:
    return f"mars-{variant}-{'exact' if exact else 'approx'}-{dtype_name}"


def _our_cases(ref: Optional[str] = None) -> list[OptimizerCase]:
    """Ours, from this checkout or (named ``<name>@<ref>``) as of git ``ref``."""
    suffix = "" if ref is None else f"@{ref}"
    cases = []
    for variant in VARIANTS:
        for exact in (False, True):
            for dtype_name, dtype in DTYPES.items():
                cases.append(
                    OptimizerCase(
                        ours_name(variant, exact, dtype_name) + suffix,
                        _ours(variant, exact, dtype, ref),
                        exact=exact,
                        description=f"levanter_mars.optim.mars(variant={variant!r}, exact={exact}, "
                        f"mu_dtype=prev_dtype={dtype_name}){suffix}",
                    )
                )
    for mode, kwargs in MARS_M_MODES.items():
        cases.append(
            OptimizerCase(
                f"mars-m-{mode}-fp32{suffix}", _mars_m(ref, **kwargs), exact=mode == "exact",
                description=f"levanter_mars.optim.mars_m({', '.join(f'{k}=True' for k in kwargs)}){suffix}",
            )
        )
    cases.append(
        OptimizerCase(MUON + suffix, _mars_m(ref, efficient=True, gamma=0.0),
                      description=f"Muon: levanter_mars.optim.mars_m(gamma=0, efficient=True){suffix}")
    )
    return cases


def all_cases(baseline_ref: Optional[str] = None) -> list[OptimizerCase]:
    """Every optimizer; with ``baseline_ref``, ours also as of that git ref, named ``<name>@<ref>``."""
    cases = [
        OptimizerCase(ADAMW, _adamw, description="optax.adamw after clip_by_global_norm(1.0)"),
        OptimizerCase(LEVANTER_MARS, _levanter_mars, description="levanter.optim.mars.MarsConfig (approx)"),
    ]
    cases += _our_cases()
    if baseline_ref is not None:
        cases += _our_cases(baseline_ref)
    return cases


def select(names: Optional[str], default: list[str], baseline_ref: Optional[str] = None) -> list[OptimizerCase]:
    """Cases by comma-separated name (``None``: ``default``); unknown names raise ``SystemExit`` listing the known.

    With ``baseline_ref``, each of ours selected is followed by the same optimizer as of that git ref.
    """
    known = {c.name: c for c in all_cases(baseline_ref)}
    wanted = names.split(",") if names else default
    if baseline_ref is not None:
        wanted = [w for name in wanted for w in (name, f"{name}@{baseline_ref}") if w in known or w == name]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"unknown optimizer(s) {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


def make_step(
    case: OptimizerCase, gradient_and_objective: Callable[[Any, Any], tuple[Any, Any]], *, guarded: bool = False
) -> tuple[Any, Callable]:
    """``(optimizer, step)`` with ``step((params, opt_state, data)) -> (new_params, new_opt_state, data)``.

    ``gradient_and_objective(params, data)`` returns the gradient to apply and the ``obj_fn`` exact mode receives
    (the loss of the same data as a function of the parameters, as ``MarsTrainer`` passes it). It is traced inside
    the step, so the data never become compile-time constants. ``guarded``: the optimizer inside the non-finite guard
    every trainer wraps it in (``optim.guard.skip_nonfinite_updates``), i.e. the update training runs.
    """
    with case.tracing():
        optimizer = case.build()
        if guarded:
            optimizer = skip_nonfinite_updates(optimizer)

    def step(inputs):
        params, opt_state, data = inputs
        with case.tracing():
            grads, objective = gradient_and_objective(params, data)
            extra = {"obj_fn": objective} if case.exact else {}
            updates, opt_state = optimizer.update(grads, opt_state, params, **extra)
        return optax.apply_updates(params, updates), opt_state, data

    return optimizer, step
