"""The comparison's figures (``compare.measure``) against hand computations on synthetic curves: tokens to target by
linear interpolation, the speed-up, the final-loss difference, and the paired bootstrap's intervals, whose bounds
for two seeds are known exactly (each of the four equally likely resamples is enumerated by hand)."""

from __future__ import annotations

import pytest

from levanter_mars.compare.measure import (
    Curve, mean_curve, measure_arm, percentile_interval, speedup, target_of, time_speedup, tokens_to_target,
)  # fmt: skip

TOKENS = (100.0, 200.0, 300.0, 400.0)


def curve(*losses):
    return Curve(TOKENS, tuple(losses))


def test_tokens_to_target_interpolates_between_eval_points():
    c = curve(8.0, 6.0, 5.0, 4.5)
    assert tokens_to_target(c, 5.5) == pytest.approx(250.0)  # halfway from (200, 6.0) to (300, 5.0)
    assert tokens_to_target(c, 4.6) == pytest.approx(380.0)  # 0.4 of 0.5 from (300, 5.0) to (400, 4.5)
    assert tokens_to_target(c, 6.0) == 200.0  # reached exactly at an eval point
    assert tokens_to_target(c, 9.0) == 100.0  # reached at the first eval point: that point's tokens
    assert tokens_to_target(c, 4.0) is None  # never
    assert tokens_to_target(curve(8.0, None, 5.0, 4.5), 5.0) is None  # not finite before reaching it
    # The first time, not the last: a curve that dips below and comes back up reached it at the dip.
    assert tokens_to_target(curve(8.0, 5.0, 5.5, 5.2), 5.2) == pytest.approx(100 + 100 * (8.0 - 5.2) / (8.0 - 5.0))


def test_mean_curve_is_pointwise_and_refuses_other_eval_points():
    m = mean_curve([curve(8.0, 6.0, 5.0, 4.0), curve(6.0, 5.0, None, 3.0)])
    assert m.losses == (7.0, 5.5, None, 3.5)
    with pytest.raises(ValueError, match="different tokens"):
        mean_curve([curve(1.0, 1.0, 1.0, 1.0), Curve((1.0, 2.0, 3.0, 5.0), (1.0, 1.0, 1.0, 1.0))])


# Two seeds. Baseline finals 5.0 and 5.2: target 5.1. The arm's curves are ahead of the baseline's.
BASELINE = [curve(8.0, 6.0, 5.4, 5.0), curve(8.0, 6.2, 5.6, 5.2)]
ARM = [curve(7.0, 5.2, 4.9, 4.7), curve(7.0, 5.6, 5.1, 4.9)]


def by_hand(seeds, arm=ARM):
    """The definitions, written out again for the seeds of one resample (a plain re-implementation)."""
    target = sum(BASELINE[i].losses[-1] for i in seeds) / len(seeds)

    def mean(curves, j):
        return sum(curves[i].losses[j] for i in seeds) / len(seeds)

    def reach(curves):
        for j in range(4):
            if mean(curves, j) <= target:
                if j == 0:
                    return TOKENS[0]
                l0, l1 = mean(curves, j - 1), mean(curves, j)
                return TOKENS[j - 1] + (l0 - target) / (l0 - l1) * (TOKENS[j] - TOKENS[j - 1])
        return None

    arm_final = sum(arm[i].losses[-1] for i in seeds) / len(seeds)
    b, a = reach(BASELINE), reach(arm)
    return {"speedup": b / a if a else None, "difference": arm_final - target, "arm_final": arm_final, "arm": a}


def test_point_figures_follow_the_definitions():
    m = measure_arm(BASELINE, ARM, [0, 1], confidence=0.95, samples=2000, seed=0)
    hand = by_hand([0, 1])
    assert target_of(BASELINE) == pytest.approx(5.1)
    # Baseline mean curve (8.0, 6.1, 5.5, 5.1): reaches 5.1 at its last point, 400 tokens. Arm mean (7.0, 5.4, 5.0,
    # 4.8): between 200 (5.4) and 300 (5.0), at 200 + 100 * 0.3 / 0.4 = 275 tokens. Speed-up 400 / 275.
    assert hand["speedup"] == pytest.approx(400 / 275)
    assert m.tokens_to_target == pytest.approx(275.0)
    assert m.speedup == pytest.approx(400 / 275)
    assert m.final_loss == pytest.approx(4.8)
    assert m.final_loss_difference == pytest.approx(4.8 - 5.1)


def test_paired_bootstrap_bounds_are_the_extreme_resamples_for_two_seeds():
    """With two seeds a resample is (0, 0), (1, 1) or one of each (twice as likely); the 95% bounds of thousands of
    resamples are then the smallest and largest of the three by-hand values."""
    m = measure_arm(BASELINE, ARM, [0, 1], confidence=0.95, samples=4000, seed=7)
    resamples = [by_hand(s) for s in ([0, 0], [1, 1], [0, 1])]
    speedups = [r["speedup"] for r in resamples]
    differences = [r["difference"] for r in resamples]
    assert m.speedup_interval.low == pytest.approx(min(speedups))
    assert m.speedup_interval.high == pytest.approx(max(speedups))
    assert m.final_loss_difference_interval.low == pytest.approx(min(differences))
    assert m.final_loss_difference_interval.high == pytest.approx(max(differences))
    assert m.not_reached_fraction == 0.0
    # Seeded: the same seed gives the same intervals, another seed the same bounds (they are exact here).
    again = measure_arm(BASELINE, ARM, [0, 1], confidence=0.95, samples=4000, seed=7)
    assert again == m


def test_an_arm_that_never_reaches_the_target_in_some_resamples_has_no_lower_bound():
    # Seed 1 of this arm ends at 5.3: in the resample (1, 1) the arm (final 5.3) never reaches the target (5.2).
    slow = [curve(7.0, 5.2, 4.9, 4.7), curve(8.0, 7.0, 6.0, 5.3)]
    m = measure_arm(BASELINE, slow, [0, 1], confidence=0.95, samples=4000, seed=1)
    assert by_hand([1, 1], slow)["arm"] is None and by_hand([0, 1], slow)["arm"] is not None
    assert m.speedup_interval.low is None  # the lowest resamples never reached it
    assert m.not_reached_fraction == pytest.approx(0.25, abs=0.03)  # (1, 1): one resample in four
    assert m.speedup is not None  # on both seeds the mean curve reaches 5.1: (7.5, 6.1, 5.45, 5.0)
    assert m.speedup == pytest.approx(400 / (300 + 100 * (5.45 - 5.1) / (5.45 - 5.0)))


def test_the_baseline_against_itself_is_one_exactly():
    m = measure_arm(BASELINE, BASELINE, [0, 1], confidence=0.95, samples=500, seed=0)
    assert m.speedup == 1.0 and m.speedup_interval.low == m.speedup_interval.high == 1.0
    assert m.final_loss_difference == 0.0


def test_percentile_interval_takes_bounds_from_the_values():
    values = list(range(1, 101))  # 1..100
    interval = percentile_interval(values, 0.9)
    assert (interval.low, interval.high) == (5.0, 95.0)  # no interpolation between values
    assert percentile_interval([float("-inf")] * 10 + [1.0] * 90, 0.9).low is None
    assert percentile_interval([float("-inf")] * 3 + [1.0] * 97, 0.9).low == 1.0  # 3% below the 5% bound


def test_speedup_and_time_speedup():
    assert speedup(400.0, 200.0) == 2.0 and speedup(400.0, None) is None
    # 2x fewer tokens at 2x the seconds per token (exact MARS's two gradients): no faster in time.
    assert time_speedup(2.0, 1e-4, 2e-4) == pytest.approx(1.0)
    assert time_speedup(None, 1e-4, 2e-4) is None
