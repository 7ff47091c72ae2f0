"""plan_reclaim with keep-warm targets (ReclaimPolicy.warm_targets): after every protection, never past one."""

from __future__ import annotations

import pytest

from raygpu.model.reclaim import DecisionAction, ReclaimPolicy, ReclaimReason
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.reclaim import NOW_S, world

R = ReclaimReason
G8 = {"GPU": 8}
WHY = "keep 1 warm = q0.8 of the demand rise over the 180s start-up"


def plan(w, **policy):
    snapshot, cluster = w.obj()
    return plan_reclaim(snapshot, cluster, ReclaimPolicy(**policy), NOW_S)


def verdicts(p):
    return {d.pod_name: d.reason for d in p.decisions if d.pod_name != "rc-head"}


CASES = [
    # (case, world, warm targets, {pod: reason})
    ("no timeout: idle 5 s beyond the target goes; the least idle stays warm",
     world().worker("a", idle_for_s=900).worker("b", idle_for_s=5), {"gpu": 1}, {"a": R.IDLE, "b": R.KEEP_WARM}),
    ("target 0 deletes every idle worker at once", world().worker("a", idle_for_s=1).worker("b", idle_for_s=2),
     {"gpu": 0}, {"a": R.IDLE, "b": R.IDLE}),
    ("a target above the idle workers keeps them all", world().worker("a", idle_for_s=900), {"gpu": 3},
     {"a": R.KEEP_WARM}),
    ("busy workers are not warm", world().worker("busy").worker("a", idle_for_s=900), {"gpu": 0},
     {"busy": R.NOT_IDLE_LONG_ENOUGH, "a": R.IDLE}),
    ("a bundle holder stays and is not counted warm",
     world().worker("h", idle_for_s=900).worker("a", idle_for_s=900).worker("b", idle_for_s=800)
     .pg([G8], state="CREATED", on=["h"]), {"gpu": 1}, {"h": R.HOLDS_BUNDLE, "a": R.IDLE, "b": R.KEEP_WARM}),
    ("start-up grace and live reservations keep, whatever the target",
     world().worker("young", idle_for_s=900, age_s=10).worker("res", idle_for_s=900, labels={"raygpu.io/reservation": "r"}),
     {"gpu": 0}, {"young": R.STARTUP_GRACE, "res": R.LIVE_RESERVATION}),
    ("a pending PG's worker is needed, not warm: the target keeps one more",
     world().worker("a", idle_for_s=900).worker("b", idle_for_s=800).worker("c", idle_for_s=700).pg_pending([G8]),
     {"gpu": 1}, {"a": R.IDLE, "b": R.KEEP_WARM, "c": R.NEEDED_BY_PENDING_PG}),
    ("the group minimum's idle workers count as warm",
     world().group("gpu", min_replicas=2).worker("a", idle_for_s=900).worker("b", idle_for_s=800)
     .worker("c", idle_for_s=700), {"gpu": 2}, {"a": R.IDLE, "b": R.GROUP_MINIMUM, "c": R.GROUP_MINIMUM}),
    ("the minimum keeps more than the target: the minimum's reason",
     world().group("gpu", min_replicas=2).worker("a", idle_for_s=900).worker("b", idle_for_s=800), {"gpu": 0},
     {"a": R.GROUP_MINIMUM, "b": R.GROUP_MINIMUM}),
    ("Ray unreachable keeps all", world().worker("a", idle_for_s=900).ray_down(), {"gpu": 0}, {"a": R.RAY_UNREACHABLE}),
    ("another group keeps its fixed timeout",
     world().worker("g1", idle_for_s=300).worker("c1", group="cpu", idle_for_s=300), {"gpu": 0},
     {"g1": R.IDLE, "c1": R.NOT_IDLE_LONG_ENOUGH}),
]


@pytest.mark.parametrize("case,w,targets,expected", CASES, ids=[c[0] for c in CASES])
def test_keep_warm_verdicts(case, w, targets, expected):
    p = plan(w, warm_targets=targets, warm_reasons={g: WHY for g in targets})
    assert {k: v for k, v in verdicts(p).items() if k in expected} == expected


def test_the_warm_decision_names_the_target_and_its_reason():
    p = plan(world().worker("a", idle_for_s=900).worker("b", idle_for_s=5), warm_targets={"gpu": 1},
             warm_reasons={"gpu": WHY})
    assert p.decision("b").detail == f"warm target 1 of group gpu: {WHY}"
    assert p.decision("a").detail == "idle 900s, beyond warm target 1"
    assert p.deleted_pods == ("a",) and p.to_delete[0].replicas == 1


def test_a_drained_worker_is_never_kept_warm():
    w = world().worker("a", idle_for_s=900).worker("b", idle_for_s=5)
    p = plan(w, warm_targets={"gpu": 1}, drained_pods=frozenset({"b"}))
    assert verdicts(p) == {"a": R.KEEP_WARM, "b": R.DRAINED}


def test_whole_node_first_the_warm_worker_shares_a_node():
    w = (world().worker("alone", idle_for_s=5).worker("shared", idle_for_s=900, k8s_node="k1")
         .busy_pod("other", k8s_node="k1"))
    assert verdicts(plan(w, warm_targets={"gpu": 1})) == {"alone": R.IDLE, "shared": R.KEEP_WARM}


def test_without_warm_targets_the_plan_is_the_fixed_timeout_one():
    w = world().worker("a", idle_for_s=900).worker("b", idle_for_s=5)
    assert plan(w) == plan(w, warm_reasons={"gpu": "ignored without a target"})
    assert verdicts(plan(w)) == {"a": R.IDLE, "b": R.NOT_IDLE_LONG_ENOUGH}


def test_every_keep_warm_decision_is_a_keep():
    p = plan(world().worker("a", idle_for_s=1).worker("b", idle_for_s=2), warm_targets={"gpu": 2})
    assert all(d.action is DecisionAction.KEEP for d in p.decisions) and not p.to_delete


# ------------------------------------------------ the hold (ReclaimPolicy.warm_hold_s, WarmSettings.hold_startups)
def test_a_hold_keeps_a_worker_beyond_the_target_until_idle_that_long():
    w = world().worker("a", idle_for_s=900).worker("b", idle_for_s=100).worker("c", idle_for_s=5)
    assert verdicts(plan(w, warm_targets={"gpu": 0})) == {"a": R.IDLE, "b": R.IDLE, "c": R.IDLE}
    p = plan(w, warm_targets={"gpu": 0}, warm_hold_s={"gpu": 180.0})
    assert verdicts(p) == {"a": R.IDLE, "b": R.NOT_IDLE_LONG_ENOUGH, "c": R.NOT_IDLE_LONG_ENOUGH}
    assert p.decision("b").detail == "idle 100s < timeout 180s"


def test_workers_within_the_hold_count_toward_the_target():
    """Target 2, two workers within the hold: both are the warm ones, so the two past it go."""
    w = (world().worker("a", idle_for_s=900).worker("b", idle_for_s=800).worker("c", idle_for_s=100)
         .worker("d", idle_for_s=5))
    p = plan(w, warm_targets={"gpu": 2}, warm_hold_s={"gpu": 180.0})
    assert verdicts(p) == {"a": R.IDLE, "b": R.IDLE, "c": R.NOT_IDLE_LONG_ENOUGH, "d": R.NOT_IDLE_LONG_ENOUGH}
    p = plan(w, warm_targets={"gpu": 3}, warm_hold_s={"gpu": 180.0})  # one more warm than the hold has
    assert verdicts(p)["a"] == R.IDLE and verdicts(p)["b"] == R.KEEP_WARM


def test_a_hold_without_a_target_is_ignored():
    w = world().worker("a", idle_for_s=900).worker("b", idle_for_s=5)
    assert plan(w, warm_hold_s={"gpu": 180.0}) == plan(w)


def test_plan_warm_learns_the_hold_from_the_measured_startups():
    from raygpu.model.warm import GroupHistory, WarmHistory, WarmSettings
    from raygpu.plan.reclaim.warm import plan_warm

    demand = tuple((60.0 * i, i % 3) for i in range(60))
    h = WarmHistory(groups={"gpu": GroupHistory(demand=demand, startup_s=(150.0, 170.0, 400.0))})
    now = 60.0 * 59
    off = plan_warm(h, ["gpu"], now, WarmSettings(hold_startups=0))["gpu"]
    on = plan_warm(h, ["gpu"], now, WarmSettings(hold_startups=1.0))["gpu"]
    assert off.warm is not None and off.hold_s == 0.0 and "idle" not in off.reason.split(";")[-1]
    assert on.warm == off.warm and on.hold_s == 170.0  # the median start-up
    assert "beyond it, idle 170s first (1 start-ups)" in on.reason
    assert plan_warm(h, ["gpu"], now, WarmSettings(hold_startups=0.5))["gpu"].hold_s == 85.0


def test_the_default_hold_is_half_a_start_up():
    """Unset, ``raygpu.io/warm-hold`` is 0.5: an idle worker beyond the target stays half the median start-up
    (docs/reclaimer.md: it is what met the launch goal on both replayed traces), and the reason says so."""
    from raygpu.model.warm import DEFAULT_HOLD_STARTUPS, GroupHistory, WarmHistory, WarmSettings
    from raygpu.plan.reclaim.warm import plan_warm

    assert DEFAULT_HOLD_STARTUPS == 0.5 == WarmSettings().hold_startups
    demand = tuple((60.0 * i, i % 3) for i in range(60))
    h = WarmHistory(groups={"gpu": GroupHistory(demand=demand, startup_s=(180.0,))})
    t = plan_warm(h, ["gpu"], 60.0 * 59, WarmSettings())["gpu"]
    assert t.warm is not None and t.hold_s == 90.0
    assert t.reason.endswith("; beyond it, idle 90s first (0.5 start-ups)"), t.reason
    # in the plan: a worker beyond the target idle 60 s stays, one idle 120 s goes
    w = world().worker("a", idle_for_s=120).worker("b", idle_for_s=60)
    assert verdicts(plan(w, warm_targets={"gpu": 0}, warm_hold_s={"gpu": t.hold_s})) == {
        "a": R.IDLE, "b": R.NOT_IDLE_LONG_ENOUGH}
