"""Optimizer-state layouts that earlier mains wrote, and how today's code loads a checkpoint in any of them.

A checkpoint stores each leaf of the state under its key path (Levanter's tensorstore layout), and a chain's states
are numbered by position: ``opt_state/inner_state/inner_state/1/mu/...``. A change that moves a leaf renames it, so
a checkpoint written before the change names it differently. Each known layout is a pair of pure maps between
today's optimizer state and the state as that layout stored it. A checkpoint's layout is the first one whose every
path is stored (Levanter checks the paths before it reads a byte), and the state loaded that way is mapped to today's.
Only a report of optimizer-state paths that are not stored sends the load on to the next layout.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from typing import Any, Callable, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import optax

from levanter_mars.compat.levanter_training import missing_checkpoint_paths
from levanter_mars.optim.guard import NonFiniteGuardState
from levanter_mars.optim.mars_family import ScaleByMarsState
from levanter_mars.training.errors import CheckpointError

logger = logging.getLogger(__name__)

State = TypeVar("State")


class Layout(NamedTuple):
    name: str
    written_by: str
    to_stored: Callable[[Any], Any]
    """Today's optimizer state -> the state as this layout stored it."""
    to_current: Callable[[Any], Any]
    """The inverse: a state loaded in this layout -> today's."""


def _is_tuple(x: Any) -> bool:
    return type(x) is tuple  # a chain's state; NamedTuples are states of single transformations


def _is_mars_chain(x: Any) -> bool:
    return _is_tuple(x) and len(x) > 0 and isinstance(x[0], ScaleByMarsState)


def _is_slotted_mars_chain(x: Any) -> bool:
    return _is_tuple(x) and len(x) > 1 and isinstance(x[0], optax.EmptyState) and isinstance(x[1], ScaleByMarsState)


def _with_leading_slot(opt_state: Any) -> Any:
    return jax.tree.map(lambda x: (optax.EmptyState(), *x) if _is_mars_chain(x) else x, opt_state,
                        is_leaf=_is_mars_chain)


def _without_leading_slot(opt_state: Any) -> Any:
    return jax.tree.map(lambda x: x[1:] if _is_slotted_mars_chain(x) else x, opt_state,
                        is_leaf=_is_slotted_mars_chain)


class GuardStateWithoutCount(NamedTuple):
    """The non-finite guard's state before it counted the output values it keeps out (``nonfinite_outputs``)."""

    inner_state: Any
    skipped_steps: Any
    consecutive_skips: Any


def _is_guard_state(x: Any) -> bool:
    return isinstance(x, NonFiniteGuardState)


def _without_output_count(opt_state: Any) -> Any:
    return jax.tree.map(lambda g: GuardStateWithoutCount(g.inner_state, g.skipped_steps, g.consecutive_skips)
                        if _is_guard_state(g) else g, opt_state, is_leaf=_is_guard_state)  # fmt: skip


def _with_output_count(opt_state: Any) -> Any:
    def counted(g: Any) -> Any:
        if not isinstance(g, GuardStateWithoutCount):
            return g
        return NonFiniteGuardState(g.inner_state, g.skipped_steps, g.consecutive_skips, jnp.zeros([], jnp.float32))

    return jax.tree.map(counted, opt_state, is_leaf=lambda x: isinstance(x, GuardStateWithoutCount))


CURRENT = Layout("current", "today's main", lambda s: s, lambda s: s)
#: The guard's state had no ``nonfinite_outputs``: it is loaded as zero (no value was counted then).
NO_OUTPUT_COUNT = Layout("no-output-count", "f18f19f's successors to 7ab9a95", _without_output_count,
                         _with_output_count)  # fmt: skip
#: ``mars()``/``mars_m()`` began their chain with a stateless slot (``clip_by_global_norm`` at 949b23f, then
#: ``optax.identity()`` once the clip was folded into ``scale_by_mars``), so the MARS state was chain position 1; the
#: guard's state had no output count either.
LEADING_SLOT = Layout("leading-slot", "949b23f to f18f19f", lambda s: _with_leading_slot(_without_output_count(s)),
                      lambda s: _with_output_count(_without_leading_slot(s)))  # fmt: skip
LAYOUTS = (CURRENT, NO_OUTPUT_COUNT, LEADING_SLOT)


def load_in_any_layout(path: str, load: Callable[[Layout], State], *, state_dir: str | None = None) -> State:
    """``load(layout)`` loads the checkpoint at ``path`` as ``layout`` stored it and returns today's state. Returns the
    first layout's that loads.

    Only Levanter's report of paths the checkpoint does not store, every one of them under ``state_dir`` (where the
    optimizer state is stored: ``<path>/opt_state`` for a trainer state), means "another layout". Any other error (a
    missing checkpoint, a storage failure, a model path that is not stored) is raised as itself: it says what is wrong,
    and another layout would not load either.
    """
    state_dir = state_dir or posixpath.join(path, "opt_state")
    missing = {}
    for layout in LAYOUTS:
        try:
            state = load(layout)
        except FileNotFoundError as e:
            paths = missing_checkpoint_paths(e)
            if not paths or not all(_within(p, state_dir) for p in paths):
                raise
            missing[layout.name] = str(e)
            continue
        if layout is not CURRENT:
            logger.info("Checkpoint %s has the optimizer-state layout of %s: migrated on load", path,
                        layout.written_by)
        return state
    details = "; ".join(f"{name}: {reason[:300]}" for name, reason in missing.items())
    raise CheckpointError(
        f"checkpoint {path} matches no known optimizer-state layout ({', '.join(l.written_by for l in LAYOUTS)}): "
        f"{details}"
    )


def _within(path: str, directory: str) -> bool:
    def plain(p: str) -> str:
        return posixpath.normpath(p.split("://", 1)[-1])

    return plain(path).startswith(plain(directory) + "/")


def load_trainer_state(path: str, optimizer: optax.GradientTransformation,
                       build: Callable[[optax.GradientTransformation], Any]) -> Any:
    """Today's trainer state from the checkpoint at ``path``, whatever its known layout.

    ``build(optimizer)`` loads the checkpoint into a trainer state whose optimizer state is ``optimizer``'s.
    """

    def load(layout: Layout) -> Any:
        if layout is CURRENT:
            return build(optimizer)
        state = build(stored_as(layout, optimizer))
        return dataclasses.replace(state, optimizer=optimizer, opt_state=layout.to_current(state.opt_state))

    return load_in_any_layout(path, load)


def stored_as(layout: Layout, optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optimizer`` with its state in ``layout``: only to build the tree a checkpoint is loaded into."""

    def update(*args, **kwargs):
        raise AssertionError(f"the optimizer stored as {layout.name} only describes a checkpoint's layout")

    return optax.GradientTransformation(lambda params: layout.to_stored(optimizer.init(params)), update)
