"""A 2-slice local pod loses a slice after step 12, limps on one and grows back (issue 45), through the launcher,
Levanter's run_on_pod and the local engine's preemption command, as docs/pods.md tells a user to try it. The
scenario is bench/limping.py's (scripts/limping_record.py records its figures). ``extended`` (``make test-all``): its
pieces are held in CI by tests/test_limping.py (the plan, the driver's choices, the resize at a checkpoint with a
bitwise resume, the goodput record), tests/test_infra_local_preemption.py (the preemption command) and
tests/test_multislice.py (2 slices train as one)."""

import pytest

from levanter_mars.bench.limping import limp, one_slice_reference
from tests.helpers.training import REPO, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extended]
#: Long enough that the run is still training on one slice when the slice is back and the driver has seen it.
STEPS = 400


def test_a_two_slice_run_limps_on_one_after_a_preemption_and_grows_back_at_a_checkpoint(tmp_path, pydocs_corpus):
    config = tiny_config(tmp_path, pydocs_corpus, "limping")
    run = limp(tmp_path, config, steps=STEPS, repo=REPO)
    assert run.returncode == 0, run.log[-8000:]
    # The preemption command gives the training processes their notice first: they save and exit 9 (the attempt ends
    # preempted), unless the slice's Ray processes go before its host task reports (a slice lost).
    assert "a slice of the attempt was preempted" in run.log or "the run was preempted" in run.log, run.log[-8000:]

    # Every step exactly once, in order (a resumed attempt's log replaces what the attempt before it logged later).
    logged = [step for step, _ in run.losses()]
    assert logged == list(range(STEPS)), logged

    attempts = run.goodput()["attempts"]
    assert [a["slices"] for a in attempts] == [2, 1, 2], attempts
    shrunk, grown = attempts[1], attempts[2]
    assert shrunk["slice_change"].startswith(("2 -> 1 slice(s): a host was lost",
                                              "2 -> 1 slice(s): the run was preempted")), shrunk
    if attempts[0]["exit_code"] == 9:  # saved on the notice: the next attempt redid no step
        assert attempts[0]["steps_redone_next"] == 0 and shrunk["first_step"] == attempts[0]["last_step"] + 1
    assert shrunk["exit_code"] == 7 and "as the launcher asked (1 -> 2 slice(s)" in shrunk["reason"], shrunk
    assert grown["slice_change"].startswith("1 -> 2 slice(s): 2 slice(s) up again"), grown
    assert grown["first_step"] == shrunk["last_step"] + 1  # grew back at the 1-slice attempt's last checkpoint
    assert grown["exit_code"] == 0

    # The steps trained on one slice equal a plain 1-slice run resumed from the same checkpoint.
    resumed_from, last = shrunk["first_step"] - 1, shrunk["last_step"]
    reference = one_slice_reference(run, resumed_from, last)
    limped = {step: loss for step, loss in run.losses() if resumed_from < step <= last}
    assert sorted(reference) == sorted(limped) == list(range(resumed_from + 1, last + 1))
    worst = max(abs(limped[s] - reference[s]) for s in reference)
    assert worst <= 1e-6, {s: (limped[s], reference[s]) for s in reference}
