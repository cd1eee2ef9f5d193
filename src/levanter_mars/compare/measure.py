"""What a comparison measures: one definition of each figure, used by the report and held by the tests.

* **target**: the baseline's mean final val loss over seeds at its best point.
* **tokens to target** (of an arm): the tokens at which its seed-mean val-loss curve first reaches the target,
  linearly interpolated between eval points; None if it never does.
* **final val-loss difference**: per final seed, the arm's final val loss minus the baseline's (a seed is one
  initialization and one data order for every arm, so the two are paired); its mean (< 0: the arm ends lower).
* **speed-up**: per final seed, the baseline's tokens to its own final loss over the arm's tokens to that loss; their
  geometric mean (> 1: the arm is faster). None unless every seed reaches it.
* **intervals**: Student t over the final seeds (n - 1 degrees of freedom): of the mean final loss, of the mean
  paired difference, and of the mean log speed-up (then exponentiated). Each holds at its confidence for any n >= 2
  when the per-seed values are normal; each names its method beside it. The **resolvable difference** is the
  difference interval's half-width: differences smaller than it are within the seeds' noise.
* **time**: each arm's seconds per token from its own runs; the speed-up in time multiplies the token speed-up by
  the baseline's seconds per token over the arm's (those taken as measured).

Pure functions of curves: no file, no run, no JAX.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence



@dataclass(frozen=True)
class Curve:
    """One run's evaluations: tokens trained at each eval point, and the val loss there (None: not finite)."""

    tokens: tuple[float, ...]
    losses: tuple[Optional[float], ...]

    @property
    def final(self) -> Optional[float]:
        return self.losses[-1] if self.losses else None


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """The seed-mean curve of runs evaluated at the same tokens (None wherever a seed has no finite value)."""
    tokens = curves[0].tokens
    if any(c.tokens != tokens for c in curves):
        raise ValueError("the runs were evaluated at different tokens; a seed mean needs the same eval points")
    losses = []
    for i in range(len(tokens)):
        values = [c.losses[i] for c in curves]
        losses.append(None if any(v is None for v in values) else statistics.fmean(values))
    return Curve(tokens, tuple(losses))


def tokens_to_target(curve: Curve, target: float) -> Optional[float]:
    """First point where ``curve`` reaches ``target``, linearly interpolated from the eval point before; None if it
    never does (or turns non-finite first). Reached at the first eval point: that point's tokens."""
    previous = None
    for tokens, loss in zip(curve.tokens, curve.losses):
        if loss is None:
            return None
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(tokens)
            t0, l0 = previous
            return t0 + (l0 - target) / (l0 - loss) * (tokens - t0)
        previous = (tokens, loss)
    return None


def speedup(baseline_tokens: Optional[float], arm_tokens: Optional[float]) -> Optional[float]:
    if baseline_tokens is None or arm_tokens is None or arm_tokens <= 0:
        return None
    return baseline_tokens / arm_tokens


@dataclass(frozen=True)
class Interval:
    low: Optional[float]
    high: Optional[float]
    method: str

    def as_list(self) -> list[Optional[float]]:
        return [self.low, self.high]


T_DIFFERENCE = "paired Student t over the per-seed differences (n - 1 degrees of freedom)"
T_MEAN = "Student t over the per-seed values (n - 1 degrees of freedom)"
T_LOG_SPEEDUP = "Student t over the per-seed log speed-ups (n - 1 degrees of freedom), exponentiated"
NO_INTERVAL = "none: one seed has no spread"
NO_SPREAD = "none: the seeds agree exactly (no spread to make a t interval of)"


def t_quantile(confidence: float, n: int) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``n - 1`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1))


def t_interval(values: Sequence[float], confidence: float, method: str = T_MEAN) -> Interval:
    """mean +- t * sd / sqrt(n): it holds at its ``confidence`` for any n >= 2 when the values are normal (a range of
    the values would not: with 3 seeds the range covers the mean about 75% of the time)."""
    n = len(values)
    if n < 2:
        return Interval(None, None, NO_INTERVAL)
    if statistics.stdev(values) == 0:
        return Interval(None, None, NO_SPREAD)
    mean, half = statistics.fmean(values), half_width(values, confidence)
    return Interval(mean - half, mean + half, method)


def half_width(values: Sequence[float], confidence: float) -> float:
    return t_quantile(confidence, len(values)) * statistics.stdev(values) / math.sqrt(len(values))


def seeds_to_resolve(values: Sequence[float], confidence: float, limit: int = 1000) -> Optional[int]:
    """The fewest seeds whose interval, at this spread, would leave out 0 for a mean difference this large (None: no
    difference, or more than ``limit``)."""
    mean, sd = abs(statistics.fmean(values)), statistics.stdev(values) if len(values) > 1 else 0.0
    if mean == 0 or sd == 0:
        return None
    for n in range(2, limit + 1):
        if t_quantile(confidence, n) * sd / math.sqrt(n) < mean:
            return n
    return None


@dataclass(frozen=True)
class ArmMeasure:
    """An arm against a reference arm (the baseline), seed by seed on the final seeds both have."""

    seeds: tuple[int, ...]
    final_loss: float
    final_loss_interval: Interval
    differences: tuple[float, ...]
    """Per seed: the arm's final val loss - the reference's."""
    final_loss_difference: float
    final_loss_difference_interval: Interval
    resolvable_difference: float
    """The half-width of the difference's interval: differences smaller than this are within the seeds' noise."""
    seeds_to_resolve: Optional[int]
    """Seeds an interval would need, at this spread, to tell this difference from 0."""
    tokens_to_target: Optional[float]
    """Tokens at which the arm's seed-mean curve first reaches the target (the reference's mean final loss)."""
    speedups: tuple[Optional[float], ...]
    """Per seed: the reference's tokens to its own final loss / the arm's tokens to that loss (None: not reached)."""
    speedup: Optional[float]
    """Geometric mean of the per-seed speed-ups (None unless every seed reaches the target)."""
    speedup_interval: Interval
    speedup_is_lower_bound: bool = False
    """A seed reached the target at its first evaluation: the speed-up is at least ``speedup``, and has no interval."""


def target_of(baseline: Sequence[Curve]) -> float:
    finals = [c.final for c in baseline]
    if any(f is None for f in finals):
        raise ValueError("the baseline has a run without a finite final val loss: no target")
    return statistics.fmean(finals)


def seed_speedup(reference: Curve, arm: Curve) -> Optional[float]:
    """The reference's tokens to its own final loss over the arm's tokens to that loss (the same seed)."""
    target = reference.final
    if target is None:
        return None
    return speedup(tokens_to_target(reference, target), tokens_to_target(arm, target))


def reached_at_first_evaluation(reference: Curve, arm: Curve) -> bool:
    """The arm was at the reference's final loss by its first evaluation: when, before it, is not measured, so its
    speed-up is only known to be at least the one computed."""
    return reference.final is not None and arm.losses[:1] != () and arm.losses[0] is not None and \
        arm.losses[0] <= reference.final  # fmt: skip


def measure_arm(reference: Sequence[Curve], arm: Sequence[Curve], seeds: Sequence[int], *,
                confidence: float) -> ArmMeasure:  # fmt: skip
    """``reference[i]`` and ``arm[i]`` are the runs of ``seeds[i]``, each at its arm's best point."""
    if not (len(reference) == len(arm) == len(seeds)) or not seeds:
        raise ValueError("measure_arm needs one reference run and one arm run per seed")
    if any(c.final is None for c in (*reference, *arm)):
        raise ValueError("a run without a finite final val loss has no figures")
    finals = [c.final for c in arm]
    differences = [a.final - r.final for a, r in zip(arm, reference)]
    speedups = [seed_speedup(r, a) for r, a in zip(reference, arm)]
    reached = [s for s in speedups if s is not None]
    logs = [math.log(s) for s in reached]
    early = sum(reached_at_first_evaluation(r, a) for r, a in zip(reference, arm))
    if early and len(reached) == len(speedups):
        speedup_interval = Interval(None, None, f"none: {early} of {len(speedups)} seeds reach the target at the first "
                                                "evaluation, so the speed-up is a lower bound")  # fmt: skip
    elif len(reached) == len(speedups) and len(reached) >= 2 and statistics.stdev(logs) == 0:
        speedup_interval = Interval(None, None, NO_SPREAD)
    elif len(reached) == len(speedups) and len(reached) >= 2:
        low, high = t_interval(logs, confidence, T_LOG_SPEEDUP).as_list()
        speedup_interval = Interval(math.exp(low), math.exp(high), T_LOG_SPEEDUP)
    elif len(reached) < len(speedups):
        speedup_interval = Interval(None, None, f"none: {len(speedups) - len(reached)} of {len(speedups)} seeds never "
                                                "reach the target")  # fmt: skip
    else:
        speedup_interval = Interval(None, None, NO_INTERVAL)
    return ArmMeasure(
        seeds=tuple(seeds),
        final_loss=statistics.fmean(finals),
        final_loss_interval=t_interval(finals, confidence),
        differences=tuple(differences),
        final_loss_difference=statistics.fmean(differences),
        final_loss_difference_interval=t_interval(differences, confidence, T_DIFFERENCE),
        resolvable_difference=half_width(differences, confidence) if len(differences) > 1 else math.inf,  # 0: no spread
        seeds_to_resolve=seeds_to_resolve(differences, confidence),
        tokens_to_target=tokens_to_target(mean_curve(arm), target_of(reference)),
        speedups=tuple(speedups),
        speedup=math.exp(statistics.fmean(logs)) if reached and len(reached) == len(speedups) else None,
        speedup_interval=speedup_interval,
        speedup_is_lower_bound=bool(early),
    )


def time_speedup(token_speedup: Optional[float], baseline_seconds_per_token: Optional[float],
                 arm_seconds_per_token: Optional[float]) -> Optional[float]:  # fmt: skip
    """The speed-up in training seconds: the arm's tokens cost ``arm_seconds_per_token`` each."""
    if token_speedup is None or not baseline_seconds_per_token or not arm_seconds_per_token:
        return None
    return token_speedup * baseline_seconds_per_token / arm_seconds_per_token
