"""Which runs a comparison asks for (``compare.tuning``), from the spec and the outcomes so far: tuning first, the best
point (a diverged point loses) on the other seeds next, a point past a learning-rate edge when allowed, and the edge
flag; planned again from the same outcomes, the same runs (a stopped comparison resumes exactly)."""

from __future__ import annotations

from levanter_mars.compare.tuning import LEARNING_RATE, EndedRun, RunKey, plan, point_label, run_id
from levanter_mars.compare.spec import ArmConfig, CompareConfig, TuningConfig


def spec(**changes) -> CompareConfig:
    fields = dict(
        name="t", base="base.yaml", baseline="adamw", final_seeds=[1, 2],
        arms=[ArmConfig("adamw", {"type": "adam"}, {"learning_rate": [1e-3, 3e-3, 9e-3]}),
              ArmConfig("mars", {"type": "mars-adamw"}, {"learning_rate": [1e-3, 3e-3], "beta1": [0.9, 0.95]})],
    )  # fmt: skip
    fields.update(changes)
    return CompareConfig(**fields)


def lr_point(lr, **other):
    return ((LEARNING_RATE, lr), *other.items())


def ok(loss):
    return EndedRun("ok", loss)


def test_tuning_comes_first_on_the_tuning_seeds_and_names_its_runs():
    s = spec()
    p = plan(s, {})
    assert {k.seed for k in p.runs} == {0}  # tuning.seeds defaults to the first seed
    assert len(p.runs) == 3 + 4 and p.pending == p.runs and not p.done
    assert [k.point for k in p.runs if k.arm == "mars"] == [
        lr_point(1e-3, beta1=0.9), lr_point(1e-3, beta1=0.95), lr_point(3e-3, beta1=0.9), lr_point(3e-3, beta1=0.95)]
    assert run_id(s, RunKey("mars", lr_point(3e-3, beta1=0.95), 2)) == "t-mars-lr0.003-beta1_0.95-s2"
    assert point_label(lr_point(1.6e-2)) == "lr0.016"


def test_best_point_then_trains_on_the_other_seeds():
    s = spec()
    outcomes = {RunKey("adamw", lr_point(lr), 0): ok(loss) for lr, loss in ((1e-3, 5.0), (3e-3, 4.5), (9e-3, 4.8))}
    p = plan(s, outcomes)
    arm = p.arms["adamw"]
    assert arm.best == lr_point(3e-3) and arm.tuned and arm.edges() == {}
    assert [k for k in p.pending if k.arm == "adamw"] == [RunKey("adamw", lr_point(3e-3), 1),
                                                           RunKey("adamw", lr_point(3e-3), 2)]
    assert p.arms["mars"].best is None and not p.arms["mars"].tuned  # its tuning has not ended


def test_a_diverged_point_loses_and_a_failed_run_is_still_pending():
    s = spec()
    outcomes = {
        RunKey("adamw", lr_point(1e-3), 0): ok(5.0),
        RunKey("adamw", lr_point(3e-3), 0): EndedRun("diverged"),
        RunKey("adamw", lr_point(9e-3), 0): EndedRun("failed", 1.0),  # a crash: retried, not scored
    }
    p = plan(s, outcomes)
    assert RunKey("adamw", lr_point(9e-3), 0) in p.pending and p.arms["adamw"].best is None
    outcomes[RunKey("adamw", lr_point(9e-3), 0)] = ok(4.9)
    p = plan(s, outcomes)
    assert p.arms["adamw"].best == lr_point(9e-3)  # lower than 5.0; the diverged 3e-3 lost
    assert p.arms["adamw"].scores[lr_point(3e-3)] is None
    assert p.arms["adamw"].edges() == {LEARNING_RATE: "high"}


def test_every_point_diverged_ends_the_arm_without_a_best():
    s = spec()
    outcomes = {RunKey("adamw", lr_point(lr), 0): EndedRun("diverged") for lr in (1e-3, 3e-3, 9e-3)}
    p = plan(s, outcomes)
    assert p.arms["adamw"].tuned and p.arms["adamw"].best is None
    assert not [k for k in p.pending if k.arm == "adamw"]


def test_a_best_learning_rate_at_the_edge_adds_the_next_point_once():
    s = spec(tuning=TuningConfig(extend_at_edge=1))
    outcomes = {RunKey("adamw", lr_point(lr), 0): ok(loss) for lr, loss in ((1e-3, 5.0), (3e-3, 4.6), (9e-3, 4.5))}
    p = plan(s, outcomes)
    arm = p.arms["adamw"]
    assert arm.points[-1] == lr_point(2.7e-2) and arm.extensions == 1 and arm.best is None  # 9e-3 x 3
    assert RunKey("adamw", lr_point(2.7e-2), 0) in p.pending
    outcomes[RunKey("adamw", lr_point(2.7e-2), 0)] = ok(4.4)  # better again: the limit stops it there, flagged
    arm = plan(s, outcomes).arms["adamw"]
    assert arm.best == lr_point(2.7e-2) and arm.tuned and arm.edges() == {LEARNING_RATE: "high"}
    outcomes[RunKey("adamw", lr_point(2.7e-2), 0)] = ok(4.7)  # worse: 9e-3 is inside the grid now
    arm = plan(s, outcomes).arms["adamw"]
    assert arm.best == lr_point(9e-3) and arm.edges() == {}


def test_the_low_edge_extends_downwards_for_the_best_points_other_fields():
    s = spec(tuning=TuningConfig(extend_at_edge=2))
    mars = {lr_point(1e-3, beta1=0.9): 4.0, lr_point(1e-3, beta1=0.95): 4.2, lr_point(3e-3, beta1=0.9): 4.5,
            lr_point(3e-3, beta1=0.95): 4.6}  # fmt: skip
    outcomes = {RunKey("mars", point, 0): ok(loss) for point, loss in mars.items()}
    arm = plan(s, outcomes).arms["mars"]
    assert arm.points[-1] == lr_point(3.33333e-4, beta1=0.9)  # 1e-3 / 3, at the best point's beta1


def test_planning_again_from_the_same_outcomes_asks_for_the_same_runs():
    s = spec()
    outcomes = {RunKey("adamw", lr_point(lr), 0): ok(loss) for lr, loss in ((1e-3, 5.0), (3e-3, 4.5), (9e-3, 4.8))}
    outcomes[RunKey("adamw", lr_point(3e-3), 1)] = ok(4.4)
    first, second = plan(s, outcomes), plan(s, dict(outcomes))
    assert first.pending == second.pending and RunKey("adamw", lr_point(3e-3), 1) not in first.pending
    everything = {k: ok(4.0) for k in plan(s, {}).runs}
    everything |= {k: ok(4.0) for k in plan(s, everything).runs}
    assert plan(s, everything).done
