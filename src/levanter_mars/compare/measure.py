"""What a comparison measures: one definition of each figure, used by the report and held by the tests.

* **target**: the baseline's mean final val loss over seeds at its best point.
* **tokens to target** (of an arm): the tokens at which its seed-mean val-loss curve first reaches the target,
  linearly interpolated between eval points; None if it never does.
* **speed-up**: the baseline's tokens to target / the arm's (> 1: the arm is faster).
* **final val-loss difference**: the arm's mean final val loss minus the baseline's (< 0: the arm ends lower).
* **intervals**: a seeded, paired bootstrap over seeds (a seed is one initialization and one data order for every
  arm, so a resample takes the same seeds for the baseline and the arm), percentile bounds taken from the
  resampled values themselves. A resample in which the arm never reaches the target counts as the lowest speed-up;
  a lower bound that falls there is None ("not reached within the budget").
* **time**: each arm's seconds per token from its own runs; the speed-up in time multiplies the token speed-up by
  the baseline's seconds per token over the arm's (those taken as measured, not resampled).

Pure functions of curves: no file, no run, no JAX.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


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

    def as_list(self) -> list[Optional[float]]:
        return [self.low, self.high]


@dataclass(frozen=True)
class ArmMeasure:
    """An arm against the baseline, on the seeds both have."""

    seeds: tuple[int, ...]
    final_loss: float
    final_loss_interval: Interval
    final_loss_difference: float
    final_loss_difference_interval: Interval
    tokens_to_target: Optional[float]
    speedup: Optional[float]
    speedup_interval: Interval
    not_reached_fraction: float
    """Of the bootstrap resamples, the share in which the arm never reached the resample's target."""


def target_of(baseline: Sequence[Curve]) -> float:
    finals = [c.final for c in baseline]
    if any(f is None for f in finals):
        raise ValueError("the baseline has a run without a finite final val loss: no target")
    return statistics.fmean(finals)


def measure_arm(baseline: Sequence[Curve], arm: Sequence[Curve], seeds: Sequence[int], *, confidence: float,
                samples: int, seed: int) -> ArmMeasure:  # fmt: skip
    """``baseline[i]`` and ``arm[i]`` are the runs of ``seeds[i]``, each at its arm's best point."""
    if not (len(baseline) == len(arm) == len(seeds)) or not seeds:
        raise ValueError("measure_arm needs one baseline run and one arm run per seed")
    point = _figures(baseline, arm)
    rng = np.random.default_rng(seed)
    resampled = [_figures([baseline[i] for i in idx], [arm[i] for i in idx])
                 for idx in rng.integers(0, len(seeds), size=(samples, len(seeds)))]  # fmt: skip
    not_reached = sum(r.speedup is None for r in resampled)
    return ArmMeasure(
        seeds=tuple(seeds),
        final_loss=point.arm_final,
        final_loss_interval=percentile_interval([r.arm_final for r in resampled], confidence),
        final_loss_difference=point.difference,
        final_loss_difference_interval=percentile_interval([r.difference for r in resampled], confidence),
        tokens_to_target=point.arm_tokens,
        speedup=point.speedup,
        speedup_interval=percentile_interval([-math.inf if r.speedup is None else r.speedup for r in resampled],
                                             confidence),  # fmt: skip
        not_reached_fraction=not_reached / samples,
    )


@dataclass(frozen=True)
class _Figures:
    arm_final: float
    difference: float
    arm_tokens: Optional[float]
    speedup: Optional[float]


def _figures(baseline: Sequence[Curve], arm: Sequence[Curve]) -> _Figures:
    target = target_of(baseline)
    baseline_tokens = tokens_to_target(mean_curve(baseline), target)
    arm_finals = [c.final for c in arm]
    arm_final = statistics.fmean(arm_finals) if all(f is not None for f in arm_finals) else math.inf
    arm_tokens = tokens_to_target(mean_curve(arm), target)
    return _Figures(arm_final, arm_final - target, arm_tokens, speedup(baseline_tokens, arm_tokens))


def percentile_interval(values: Sequence[float], confidence: float) -> Interval:
    """The two-sided ``confidence`` interval of ``values``, bounds taken from the values themselves (no
    interpolation between resamples); an infinite bound is None."""
    alpha = (1 - confidence) / 2
    low, high = np.percentile(np.asarray(values, dtype=float), [100 * alpha, 100 * (1 - alpha)],
                              method="inverted_cdf")  # fmt: skip
    return Interval(float(low) if math.isfinite(low) else None, float(high) if math.isfinite(high) else None)


def time_speedup(token_speedup: Optional[float], baseline_seconds_per_token: Optional[float],
                 arm_seconds_per_token: Optional[float]) -> Optional[float]:  # fmt: skip
    """The speed-up in training seconds: the arm's tokens cost ``arm_seconds_per_token`` each."""
    if token_speedup is None or not baseline_seconds_per_token or not arm_seconds_per_token:
        return None
    return token_speedup * baseline_seconds_per_token / arm_seconds_per_token
