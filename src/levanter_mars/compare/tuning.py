"""Which runs a comparison needs, given the runs it has: a pure function of the spec and the outcomes so far.

Per arm: every grid point on the tuning seeds; once all of them have ended, the best point (lowest mean final val
loss on the tuning seeds; a point with a diverged or failed run loses); past a learning-rate edge, with
``tuning.extend_at_edge`` left, one point more; then the best point on the remaining seeds. A comparison stopped
anywhere and planned again from its records asks for exactly the runs still missing.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from levanter_mars.compare.spec import ArmConfig, CompareConfig

LEARNING_RATE = "learning_rate"

#: A point: the grid's fields and their values, in the grid's order.
Point = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, order=True)
class RunKey:
    arm: str
    point: Point
    seed: int


def point_label(point: Point) -> str:
    """``lr0.006``, ``lr0.006-beta1_0.9``: readable, and a valid path component."""
    parts = []
    for key, value in point:
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"lr{text}" if key == LEARNING_RATE else f"{key}_{text}")
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))


def run_id(spec: CompareConfig, key: RunKey) -> str:
    return f"{spec.name}-{key.arm}-{point_label(key.point)}-s{key.seed}"


@dataclass(frozen=True)
class EndedRun:
    """How a run ended, as far as planning cares: ``ok`` with its final val loss, ``diverged``, or ``failed``."""

    status: str
    final_loss: Optional[float] = None

    @property
    def ended(self) -> bool:
        """Final: a failed run is retried by the next invocation, so it is not; the data running out is the same
        every time, so it is."""
        return self.status in ("ok", "diverged", "data_exhausted")


@dataclass
class ArmPlan:
    arm: str
    points: list[Point]
    """The grid, and the points added past an edge, in the order they were planned."""
    scores: dict[Point, Optional[float]] = field(default_factory=dict)
    """Each point's mean final val loss on the tuning seeds (None: a run diverged, or not all have ended)."""
    best: Optional[Point] = None
    """Decided once every tuning run has ended and no point is still to be added; None while undecided or when
    every point diverged."""
    extensions: int = 0
    tuned: bool = False

    def edges(self) -> dict[str, str]:
        """For each tuned numeric field whose best value is its grid's smallest or largest: ``low`` or ``high``."""
        if self.best is None:
            return {}
        out = {}
        for i, (key, value) in enumerate(self.best):
            values = sorted({p[i][1] for p in self.points if _is_number(p[i][1])})
            if len(values) >= 2 and _is_number(value):
                if value == values[0]:
                    out[key] = "low"
                elif value == values[-1]:
                    out[key] = "high"
        return out


@dataclass
class Plan:
    arms: dict[str, ArmPlan]
    runs: list[RunKey]
    """Every run the comparison needs so far, in the order they should start."""
    pending: list[RunKey]
    """Of ``runs``, those without an ended outcome."""

    @property
    def done(self) -> bool:
        return not self.pending and all(a.tuned for a in self.arms.values())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def grid_points(arm: ArmConfig) -> list[Point]:
    keys = list(arm.grid)
    return [tuple(zip(keys, values)) for values in itertools.product(*(arm.grid[k] for k in keys))]


def plan(spec: CompareConfig, outcomes: Mapping[RunKey, EndedRun]) -> Plan:
    arms: dict[str, ArmPlan] = {}
    tuning_runs: list[RunKey] = []
    final_runs: list[RunKey] = []
    final_seeds = spec.final_seeds
    for arm in spec.arms:
        arm_plan = _tune(arm, spec.tuning_seeds, spec.tuning.extend_at_edge, outcomes)
        arms[arm.name] = arm_plan
        tuning_runs += [RunKey(arm.name, p, s) for p in arm_plan.points for s in spec.tuning_seeds]
        if arm_plan.best is not None:
            final_runs += [RunKey(arm.name, arm_plan.best, s) for s in final_seeds]
    # Seed by seed, arms interleaved: a comparison stopped early has every arm's first seeds.
    order = {s: i for i, s in enumerate(spec.seeds)}
    runs = sorted(tuning_runs, key=lambda k: order[k.seed]) + sorted(final_runs, key=lambda k: order[k.seed])
    pending = [k for k in runs if not (k in outcomes and outcomes[k].ended)]
    return Plan(arms, runs, pending)


def _tune(arm: ArmConfig, seeds: list[int], extend_at_edge: int, outcomes: Mapping[RunKey, EndedRun]) -> ArmPlan:
    arm_plan = ArmPlan(arm.name, grid_points(arm))
    while True:
        ended = all(
            RunKey(arm.name, p, s) in outcomes and outcomes[RunKey(arm.name, p, s)].ended
            for p in arm_plan.points for s in seeds
        )
        arm_plan.scores = {p: _score([outcomes.get(RunKey(arm.name, p, s)) for s in seeds]) for p in arm_plan.points}
        if not ended:
            return arm_plan
        scored = [p for p in arm_plan.points if arm_plan.scores[p] is not None]
        arm_plan.best = min(scored, key=lambda p: arm_plan.scores[p]) if scored else None
        beyond = _past_the_edge(arm_plan) if arm_plan.extensions < extend_at_edge else None
        if beyond is None:
            arm_plan.tuned = True
            return arm_plan
        arm_plan.points.append(beyond)
        arm_plan.extensions += 1
        arm_plan.best = None


def _score(outcomes: list[Optional[EndedRun]]) -> Optional[float]:
    if any(o is None or o.status != "ok" or o.final_loss is None or not math.isfinite(o.final_loss) for o in outcomes):
        return None
    return statistics.fmean(o.final_loss for o in outcomes)


def _past_the_edge(arm_plan: ArmPlan) -> Optional[Point]:
    """The next learning rate past the best point's, when that is the grid's smallest or largest: the same ratio as
    between the two nearest rates of the grid (for the best point's other fields)."""
    best = arm_plan.best
    if best is None or LEARNING_RATE not in dict(best):
        return None
    side = arm_plan.edges().get(LEARNING_RATE)
    if side is None:
        return None
    index = [k for k, _ in best].index(LEARNING_RATE)
    rates = sorted({p[index][1] for p in arm_plan.points})
    if side == "high":
        value = rates[-1] * rates[-1] / rates[-2]
    else:
        value = rates[0] * rates[0] / rates[1]
    value = float(f"{value:.6g}")
    return tuple((k, value if k == LEARNING_RATE else v) for k, v in best)
