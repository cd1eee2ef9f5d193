"""scripts/test_budget.py: the budget CI's duration report reads (tests/helpers/durations.py)."""

import json

from tests.helpers.scripts import load_script


def test_several_sessions_give_each_test_of_the_last_its_median_and_keep_slow_or_long_tests_only(tmp_path):
    sessions = [
        {"wall_seconds": 1500, "slow": ["t::pod", "t::gone"],
         "seconds": {"t::pod": 100.0, "t::quick": 0.1, "t::long": 9.0, "t::gone": 50.0}},
        {"wall_seconds": 1900, "slow": ["t::pod"], "seconds": {"t::pod": 300.0, "t::quick": 0.2, "t::long": 2.0}},
        {"wall_seconds": 1600, "slow": ["t::new"], "seconds": {"t::pod": 120.0, "t::new": 1.0, "t::long": 4.0}},
    ]
    paths = []
    for i, session in enumerate(sessions):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(session))
    output = tmp_path / "budget.json"
    arguments = ["--durations", *map(str, paths), "--output", str(output), "--note", "three runs"]
    assert load_script("test_budget").main(arguments) == 0
    budget = json.loads(output.read_text())
    # Medians: pod of 100/300/120, long of 9/2/4 (over 3 s, not slow); new is slow in the one session that ran it;
    # gone, renamed or removed after the first session, is not budgeted.
    assert budget["seconds"] == {"t::long": 4.0, "t::new": 1.0, "t::pod": 120.0}
    assert budget["made_from"]["sessions"] == 3 and budget["made_from"]["wall_seconds"] == [1500, 1900, 1600]
    assert budget["made_from"]["note"] == "three runs"


def test_the_report_names_a_test_over_its_budget_by_the_ratio_and_by_seconds():
    from tests.helpers.durations import over_budget

    budget = {"t::pod": 100.0, "t::quick": 0.3, "t::steady": 20.0}
    seconds = {"t::pod": 160.0, "t::quick": 0.9, "t::steady": 29.0, "t::new": 50.0}
    # quick is 3x its budget but 0.6 s over (noise); steady 9 s over but 1.45x.
    assert over_budget(seconds, budget) == [("t::pod", 160.0, 100.0)]


def test_each_workers_time_in_tests_and_its_end_are_counted_from_the_first_start():
    from tests.helpers.durations import busy_seconds

    timeline = [("gw0", 100.0, 130.0, "a"), ("gw1", 101.0, 111.0, "b"), ("gw1", 120.0, 125.0, "c"),
                ("gw0", 130.0, 131.0, "a")]
    assert busy_seconds(timeline) == {"gw0": (31.0, 31.0), "gw1": (15.0, 25.0)}
    assert busy_seconds([]) == {}
