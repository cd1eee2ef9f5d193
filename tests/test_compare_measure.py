"""The comparison's figures (``compare.measure``) against hand computations on synthetic curves: tokens to target by
linear interpolation, the per-seed speed-ups and differences, and their Student t intervals against scipy's own
``stats.t.interval`` (an independent reference), the resolvable difference and the seeds a difference needs."""

from __future__ import annotations

import pytest

import math
import statistics

from scipy import stats

from tests.helpers.compare_reference import seed_speedups
from levanter_mars.compare.measure import (
    T_DIFFERENCE, T_LOG_SPEEDUP, Curve, mean_curve, measure_arm, seeds_to_resolve, t_interval, time_speedup,
    tokens_to_target,
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


# Three seeds. The arm's curves are ahead of the baseline's on each seed.
BASELINE = [curve(8.0, 6.0, 5.4, 5.0), curve(8.0, 6.2, 5.6, 5.2), curve(8.0, 6.1, 5.5, 5.1)]
ARM = [curve(7.0, 5.2, 4.9, 4.7), curve(7.0, 5.6, 5.1, 4.85), curve(7.0, 5.3, 4.8, 4.75)]


def scipy_interval(values, confidence=0.95):
    """scipy's t interval of the mean: the independent reference for ``t_interval``."""
    n = len(values)
    return stats.t.interval(confidence, n - 1, loc=statistics.fmean(values), scale=stats.sem(values))


def by_hand_speedup(reference, arm):
    return seed_speedups([(TOKENS, c.losses) for c in reference], [(TOKENS, c.losses) for c in arm])


def test_t_interval_is_scipys_for_every_seed_count_and_confidence():
    for values in ([0.1, 0.3], [0.2, -0.1, 0.05], [1.0, 1.2, 0.9, 1.4, 1.1, 0.95]):
        for confidence in (0.9, 0.95, 0.99):
            low, high = t_interval(values, confidence).as_list()
            ref_low, ref_high = scipy_interval(values, confidence)
            assert low == pytest.approx(ref_low, abs=1e-12) and high == pytest.approx(ref_high, abs=1e-12)
    assert t_interval([0.3], 0.95).as_list() == [None, None]  # one seed: no spread, no interval


def test_three_seeds_give_a_t_interval_not_their_range():
    """The old percentile bootstrap over 3 seeds returned the seeds' min and max; the t interval is wider than
    that range here (t(0.975, 2) = 4.30)."""
    differences = [0.147, 0.259, 0.190]
    low, high = t_interval(differences, 0.95).as_list()
    assert low < min(differences) and high > max(differences)


def test_the_arm_is_measured_seed_by_seed_against_the_reference():
    figures = measure_arm(BASELINE, ARM, [1, 2, 3], confidence=0.95)
    differences = [a.losses[-1] - b.losses[-1] for a, b in zip(ARM, BASELINE)]
    assert list(figures.differences) == pytest.approx(differences)
    assert figures.final_loss_difference == pytest.approx(statistics.fmean(differences))
    assert figures.final_loss_difference_interval.as_list() == pytest.approx(list(scipy_interval(differences)))
    assert figures.final_loss_difference_interval.method == T_DIFFERENCE
    assert figures.final_loss == pytest.approx(statistics.fmean(a.losses[-1] for a in ARM))
    speedups = by_hand_speedup(BASELINE, ARM)
    assert list(figures.speedups) == pytest.approx(speedups)
    logs = [math.log(s) for s in speedups]
    assert figures.speedup == pytest.approx(math.exp(statistics.fmean(logs)))
    low, high = scipy_interval(logs)
    assert figures.speedup_interval.as_list() == pytest.approx([math.exp(low), math.exp(high)])
    assert figures.speedup_interval.method == T_LOG_SPEEDUP
    assert figures.resolvable_difference == pytest.approx(
        stats.t.ppf(0.975, 2) * statistics.stdev(differences) / math.sqrt(3))
    assert figures.tokens_to_target == tokens_to_target(mean_curve(ARM), statistics.fmean(
        b.losses[-1] for b in BASELINE))


def test_a_seed_that_never_reaches_the_target_leaves_no_speedup_and_says_why():
    behind = [curve(9.0, 8.0, 7.0, 6.0), *ARM[1:]]
    figures = measure_arm(BASELINE, behind, [1, 2, 3], confidence=0.95)
    assert figures.speedups[0] is None and figures.speedup is None
    assert figures.speedup_interval.as_list() == [None, None]
    assert "1 of 3 seeds never reach the target" in figures.speedup_interval.method


def test_the_seeds_a_difference_needs_are_the_fewest_whose_interval_leaves_out_zero():
    differences = [0.02, -0.01, 0.04, 0.00, 0.03]
    needed = seeds_to_resolve(differences, 0.95)
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    assert stats.t.ppf(0.975, needed - 1) * sd / math.sqrt(needed) < mean
    assert stats.t.ppf(0.975, needed - 2) * sd / math.sqrt(needed - 1) >= mean
    assert seeds_to_resolve([0.1, -0.1], 0.95) is None  # no difference to resolve


def test_the_baseline_against_itself_is_a_tie_with_speedup_one():
    figures = measure_arm(BASELINE, BASELINE, [1, 2, 3], confidence=0.95)
    assert figures.final_loss_difference == 0 and figures.speedup == pytest.approx(1.0)


def test_time_speedup_weighs_the_token_speedup_by_seconds_per_token():
    assert time_speedup(2.0, 1e-3, 2e-3) == pytest.approx(1.0)
    assert time_speedup(None, 1e-3, 2e-3) is None and time_speedup(2.0, None, 1e-3) is None


def test_a_target_reached_at_the_first_evaluation_gives_a_lower_bound_and_no_interval():
    ahead = [curve(4.9, 4.8, 4.7, 4.6), curve(5.0, 4.9, 4.8, 4.7), curve(4.95, 4.85, 4.75, 4.65)]
    figures = measure_arm(BASELINE, ahead, [1, 2, 3], confidence=0.95)
    assert figures.speedup_is_lower_bound and figures.speedup == pytest.approx(4.0)
    assert figures.speedup_interval.as_list() == [None, None] and "lower bound" in figures.speedup_interval.method


def test_seeds_that_agree_exactly_have_no_t_interval():
    assert t_interval([0.2, 0.2, 0.2], 0.95).as_list() == [None, None]
    assert "no spread" in t_interval([0.2, 0.2, 0.2], 0.95).method
    assert seeds_to_resolve([0.2, 0.2], 0.95) is None


def _record_run(arm, seed, losses, best=True):
    return {"arm": arm, "seed": seed, "status": "ok", "point": {"learning_rate": 0.1 if best else 0.2},
            "final_val_loss": losses[-1], "seconds_per_token": 1e-3 * (seed + 1), "eval_tokens": list(TOKENS),
            "eval_losses": list(losses)}  # fmt: skip


def test_resummarize_script_measures_an_old_record_on_its_fresh_seeds_only(tmp_path):
    """scripts/resummarize_compare.py: a record written with the tuning seed among the figures is re-measured on the
    fresh seeds alone, at each arm's recorded best point, its difference interval scipy's; the tuning seed refused."""
    import json
    import runpy
    import subprocess
    import sys

    from tests.helpers.training import REPO

    finals = {"adamw": {0: 5.0, 1: 5.1, 2: 5.3, 3: 5.2}, "mars": {0: 1.0, 1: 5.0, 2: 5.1, 3: 5.25}}
    runs = [_record_run(arm, s, (8.0, 7.0, 6.0, f)) for arm, by_seed in finals.items() for s, f in by_seed.items()]
    runs += [_record_run("mars", 1, (8.0, 7.0, 6.0, 0.5), best=False)]  # another point: never in the figures
    record = {"comparison": "old", "baseline": "adamw", "seeds": [0, 1, 2, 3], "tuning_seeds": [0],
              "arms": {a: {"best_point": {"learning_rate": 0.1}} for a in finals}, "runs": runs}  # fmt: skip
    resummarize = runpy.run_path(str(REPO / "scripts" / "resummarize_compare.py"))["resummarize"]
    summary = resummarize(record, [1, 2, 3], 0.95, [])
    differences = [finals["mars"][s] - finals["adamw"][s] for s in (1, 2, 3)]
    mars = summary["arms"]["mars"]
    assert mars["final_val_loss_differences"] == pytest.approx(differences)
    assert mars["final_val_loss_difference_interval"] == pytest.approx(scipy_interval(differences))
    assert summary["excluded_seeds"] == [0] and summary["target_val_loss"] == pytest.approx(5.2)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    refused = subprocess.run([sys.executable, str(REPO / "scripts" / "resummarize_compare.py"), "--record", str(path),
                              "--final_seeds", "0", "1", "--output", str(tmp_path / "out.json")],
                             capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert refused.returncode == 2 and "were the record's tuning seeds" in refused.stderr
    assert not (tmp_path / "out.json").exists()
