"""plan_reclaim as tables: one world per line, the verdict expected for each pod."""

from __future__ import annotations

import pytest

from raygpu.model.reclaim import DecisionAction, ReclaimMode, ReclaimPolicy, ReclaimReason
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.reclaim import NOW_S, world

R = ReclaimReason
IDLE = 900  # seconds, past the default 600 s timeout
G8 = {"GPU": 8}
G4 = {"GPU": 4}


def plan(w, **policy):
    snapshot, cluster = w.obj()
    return plan_reclaim(snapshot, cluster, ReclaimPolicy(**policy), NOW_S)


VERDICTS = [
    # (case, world, policy, {pod: expected reason}); IDLE is the only delete reason
    ("idle past timeout", world().worker("w1", idle_for_s=IDLE), {}, {"w1": R.IDLE}),
    ("idle under timeout", world().worker("w1", idle_for_s=300), {}, {"w1": R.NOT_IDLE_LONG_ENOUGH}),
    ("busy", world().worker("w1"), {}, {"w1": R.NOT_IDLE_LONG_ENOUGH}),
    ("no Ray node yet is not idle", world().worker("w1", ray=False), {}, {"w1": R.NOT_IDLE_LONG_ENOUGH}),
    ("head never", world().worker("w1", idle_for_s=IDLE), {"idle_timeout_s": 0}, {"rc-head": R.HEAD, "w1": R.IDLE}),
    ("holds a bundle", world().worker("w1", idle_for_s=IDLE).pg([G8], state="CREATED", on=["w1"]), {}, {"w1": R.HOLDS_BUNDLE}),
    ("startup grace", world().worker("w1", idle_for_s=IDLE, age_s=60), {}, {"w1": R.STARTUP_GRACE}),
    ("grace over", world().worker("w1", idle_for_s=IDLE, age_s=60), {"startup_grace_s": 30}, {"w1": R.IDLE}),
    ("per-group timeout override", world().worker("g1", idle_for_s=IDLE).worker("c1", group="cpu", idle_for_s=IDLE),
     {"group_idle_timeout_s": {"gpu": 1800}}, {"g1": R.NOT_IDLE_LONG_ENOUGH, "c1": R.IDLE}),
    ("override can be shorter", world().worker("w1", idle_for_s=300), {"group_idle_timeout_s": {"gpu": 120}}, {"w1": R.IDLE}),
    ("being deleted", world().worker("w1", idle_for_s=IDLE, deleting=True), {}, {"w1": R.ALREADY_DELETING}),
    ("reservation label", world().worker("w1", idle_for_s=IDLE, labels={"raygpu.io/reservation": "r1"}), {}, {"w1": R.LIVE_RESERVATION}),
    ("rg- group", world().worker("w1", group="rg-abc", idle_for_s=IDLE), {}, {"w1": R.LIVE_RESERVATION}),
    ("released reservation is reclaimable", world().worker("w1", group="rg-abc", idle_for_s=IDLE),
     {"live_reservations": frozenset({"rg-other"})}, {"w1": R.IDLE}),
    ("Ray unreachable keeps all", world().worker("w1", idle_for_s=IDLE).ray_down(), {}, {"w1": R.RAY_UNREACHABLE}),
    # 3. pending placement groups
    ("pending 8-GPU PG keeps one of two idle 8-GPU workers", world().worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE)
     .pg_pending([G8]), {}, {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.IDLE}),
    ("label selector protects only the match", world().worker("w1", idle_for_s=IDLE, ray_labels={"zone": "a"})
     .worker("w2", idle_for_s=IDLE, ray_labels={"zone": "b"}).pg_pending([G8], selectors=[{"zone": "b"}]),
     {}, {"w1": R.IDLE, "w2": R.NEEDED_BY_PENDING_PG}),
    ("negated selector", world().worker("w1", idle_for_s=IDLE, ray_labels={"zone": "a"})
     .worker("w2", idle_for_s=IDLE, ray_labels={"zone": "b"}).pg_pending([G8], selectors=[{"zone": "!a"}]),
     {}, {"w1": R.IDLE, "w2": R.NEEDED_BY_PENDING_PG}),
    ("selector matching nothing protects nothing", world().worker("w1", idle_for_s=IDLE, ray_labels={"zone": "a"})
     .pg_pending([G8], selectors=[{"zone": "c"}]), {}, {"w1": R.IDLE}),
    ("PG fits on a busy node's free GPUs", world().worker("b1", free_gpus=8).worker("w1", idle_for_s=IDLE)
     .pg_pending([G8]), {}, {"b1": R.NOT_IDLE_LONG_ENOUGH, "w1": R.IDLE}),
    ("a worker on its way out hosts no bundle", world().group("gpu", workers_to_delete=("w0",)).worker("w0", idle_for_s=IDLE)
     .worker("w1", idle_for_s=IDLE).pg_pending([G8]), {}, {"w0": R.ALREADY_DELETING, "w1": R.NEEDED_BY_PENDING_PG}),
    ("PG that needs a new worker: the group can grow, keep both", world().group("gpu", max_replicas=3)
     .worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE).pg_pending([G8] * 3, strategy="STRICT_SPREAD"),
     {}, {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.NEEDED_BY_PENDING_PG}),
    ("PG that can never fit (group at maxReplicas) protects nothing", world().group("gpu", max_replicas=2)
     .worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE).pg_pending([G8] * 3, strategy="STRICT_SPREAD"),
     {}, {"w1": R.IDLE, "w2": R.IDLE}),
    ("only a GPU-less group can grow: protects nothing", world().group("gpu", max_replicas=1).group("cpu", gpus=0)
     .worker("w1", idle_for_s=IDLE).pg_pending([G8, G8], strategy="STRICT_SPREAD"), {}, {"w1": R.IDLE}),
    ("at maxReplicas, the PG waits for a busy worker: keep the idle one", world().group("gpu", max_replicas=2)
     .worker("w1", idle_for_s=IDLE).worker("b1").pg_pending([G8, G8], strategy="STRICT_SPREAD"),
     {}, {"w1": R.NEEDED_BY_PENDING_PG, "b1": R.NOT_IDLE_LONG_ENOUGH}),
    ("at maxReplicas, the busy worker is too small for the rest: keep nothing", world().group("gpu", max_replicas=2)
     .worker("w1", idle_for_s=IDLE).worker("b1", gpus=4).pg_pending([G8, G8], strategy="STRICT_SPREAD"),
     {}, {"w1": R.IDLE}),
    ("an unplaceable PG leaves room to a placeable one", world().group("gpu", max_replicas=2)
     .worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE).pg_pending([G8] * 3, strategy="STRICT_SPREAD")
     .pg_pending([G8]), {}, {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.IDLE}),
    ("PG too big for any node protects nothing", world().worker("w1", idle_for_s=IDLE).pg_pending([{"GPU": 16}]), {}, {"w1": R.IDLE}),
    ("PACK puts two halves on one node", world().worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE)
     .pg_pending([G4, G4]), {}, {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.IDLE}),
    ("STRICT_SPREAD needs a node per bundle", world().worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE)
     .worker("w3", idle_for_s=IDLE).pg_pending([G4, G4], strategy="STRICT_SPREAD"),
     {}, {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.NEEDED_BY_PENDING_PG, "w3": R.IDLE}),
    ("STRICT_PACK needs the sum on one node", world().worker("w1", idle_for_s=IDLE, gpus=4).worker("w2", idle_for_s=IDLE)
     .pg_pending([G4, G4], strategy="STRICT_PACK"), {}, {"w1": R.IDLE, "w2": R.NEEDED_BY_PENDING_PG}),
    ("rescheduling PG avoids its own node under STRICT_SPREAD", world().worker("w1", idle_for_s=IDLE, free_gpus=4)
     .worker("w2", idle_for_s=IDLE).worker("w3", idle_for_s=IDLE, gpus=2)
     .pg([G4, G4], state="RESCHEDULING", strategy="STRICT_SPREAD", on=["w1", None]),
     {}, {"w1": R.HOLDS_BUNDLE, "w2": R.NEEDED_BY_PENDING_PG, "w3": R.IDLE}),
    ("created PG protects nothing more", world().worker("w1", idle_for_s=IDLE).pg([G8], state="CREATED", on=[None]), {}, {"w1": R.IDLE}),
    ("protection prefers the worker the minimum keeps anyway", world().group("a", min_replicas=1)
     .worker("z1", group="a", idle_for_s=IDLE).worker("b1", group="b", idle_for_s=IDLE).pg_pending([G8]),
     {}, {"z1": R.NEEDED_BY_PENDING_PG, "b1": R.IDLE}),
    # 4. group minimum and 5. defragmentation
    ("group minimum keeps the least idle", world().group("gpu", min_replicas=1).worker("w1", idle_for_s=IDLE)
     .worker("w2", idle_for_s=2 * IDLE), {}, {"w1": R.GROUP_MINIMUM, "w2": R.IDLE}),
    ("minimum equal to replicas keeps all", world().group("gpu", min_replicas=2).worker("w1", idle_for_s=IDLE)
     .worker("w2", idle_for_s=IDLE), {}, {"w1": R.GROUP_MINIMUM, "w2": R.GROUP_MINIMUM}),
    ("defrag frees a whole node over a shared one", world().group("gpu", min_replicas=1)
     .worker("wa", k8s_node="k1", idle_for_s=3 * IDLE).busy_pod("other", k8s_node="k1")
     .worker("wb", k8s_node="k2", idle_for_s=IDLE), {}, {"wa": R.GROUP_MINIMUM, "wb": R.IDLE}),
    ("co-located candidates free their node together", world().worker("w1", k8s_node="k1", idle_for_s=IDLE)
     .worker("w2", k8s_node="k1", idle_for_s=IDLE), {}, {"w1": R.IDLE, "w2": R.IDLE}),
]


@pytest.mark.parametrize("case,w,policy,expected", VERDICTS, ids=[c[0] for c in VERDICTS])
def test_verdicts(case, w, policy, expected):
    p = plan(w, **policy)
    got = {name: p.decision(name).reason for name in expected}
    assert got == expected, [p.decision(n).detail for n in expected]
    for name, reason in expected.items():
        action = DecisionAction.DELETE if reason is R.IDLE else DecisionAction.KEEP
        assert p.decision(name).action is action
    assert set(p.deleted_pods) == {n for n, r in expected.items() if r is R.IDLE}


def test_pending_pg_keeps_exactly_one_of_two():
    p = plan(world().worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE).pg_pending([G8]))
    reasons = sorted(d.reason.value for d in p.decisions if d.pod_name != "rc-head")
    assert reasons == sorted([R.IDLE.value, R.NEEDED_BY_PENDING_PG.value])
    assert p.to_delete[0].replicas == 1 and len(p.to_delete[0].added) == 1


def test_scale_down_patch_per_group():
    p = plan(world().worker("c1", group="cpu").worker("g2", group="gpu", idle_for_s=IDLE)
             .worker("g1", group="gpu", idle_for_s=IDLE))
    (sd,) = p.to_delete
    assert (sd.group_name, sd.group_index, sd.old_replicas, sd.replicas) == ("gpu", 1, 2, 0)
    assert sd.workers_to_delete == sd.added == ("g1", "g2")
    assert p.reclaimed_gpus == 16 and p.idle_gpu_s == 16 * IDLE
    assert p.freed_k8s_nodes == ("k-g1", "k-g2") and p.cluster_resource_version == "42"


def test_already_in_workers_to_delete_is_not_counted_twice():
    w = (world().group("gpu", replicas=3, workers_to_delete=("w0",))
         .worker("w0", idle_for_s=IDLE).worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE))
    p = plan(w)
    assert p.decision("w0").reason is R.ALREADY_DELETING
    (sd,) = p.to_delete
    assert sd.added == ("w1", "w2")
    assert sd.workers_to_delete == ("w0", "w1", "w2")  # w0 once
    assert sd.replicas == 1  # 3 - 2 new deletions; w0 not subtracted again


def test_pending_deletion_holds_the_minimum_until_it_is_gone():
    # replicas 2 (w0 already subtracted by its writer), min 1: w0 still exists, so wait.
    w = (world().group("gpu", min_replicas=1, workers_to_delete=("w0",))
         .worker("w0", idle_for_s=IDLE).worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE))
    p = plan(w)
    assert len(p.deleted_pods) == 0 and p.decision("w1").reason is R.GROUP_MINIMUM


def test_defrag_reports_freed_node_only_when_empty():
    p = plan(world().worker("w1", k8s_node="k1", idle_for_s=IDLE).busy_pod("other", k8s_node="k1")
             .worker("w2", k8s_node="k2", idle_for_s=IDLE))
    assert p.deleted_pods == ("w1", "w2") and p.freed_k8s_nodes == ("k2",)


def test_plan_is_deterministic():
    w = (world().group("gpu", min_replicas=1).worker("w3", idle_for_s=IDLE).worker("w1", idle_for_s=IDLE)
         .worker("w2", idle_for_s=IDLE).pg_pending([G8]))
    snapshot, cluster = w.obj()
    first = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)
    assert first == plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)
    shuffled = snapshot.model_copy(update={
        "k8s": snapshot.k8s.model_copy(update={"pods": tuple(reversed(snapshot.k8s.pods))}),
        "ray": snapshot.ray.model_copy(update={"nodes": tuple(reversed(snapshot.ray.nodes))})})
    assert plan_reclaim(shuffled, cluster, ReclaimPolicy(), NOW_S) == first
    assert [d.pod_name for d in first.decisions] == sorted(d.pod_name for d in first.decisions)


def test_mode_does_not_change_the_plan():
    w = world().worker("w1", idle_for_s=IDLE)
    assert plan(w, mode=ReclaimMode.DRY_RUN) == plan(w, mode=ReclaimMode.ON)
    assert ReclaimPolicy(mode="on").applies and not ReclaimPolicy(mode="dry-run").applies


def test_other_clusters_pods_are_ignored():
    snapshot, cluster = world().worker("w1", idle_for_s=IDLE).obj()
    cluster = cluster.model_copy(update={"name": "other"})
    assert plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S).decisions == ()


def test_a_bad_num_gpus_with_a_pending_pg_is_planned_not_raised():
    """rayStartParams num-gpus "abc" (recorded at parse time) must not make plan_reclaim raise each cycle."""
    snapshot, cluster = world().worker("w1", idle_for_s=IDLE).pg_pending([{"GPU": 16}]).obj()
    bad = cluster.worker_groups[0].model_copy(update={"ray_start_params": {"num-gpus": "abc"}})
    cluster = cluster.model_copy(update={"worker_groups": (bad,)})
    p = plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)
    assert {d.pod_name: d.reason for d in p.decisions}["w1"] is R.IDLE  # no group can host 16 GPUs
    assert bad.ray_gpus == 8  # the safe default: the container's GPU limit, as KubeRay would use


# Issue 14 items 6 and 7: where the planner before the rewrite deleted a worker a pending PG needs. Each case
# fails on c879e1c (the plan deleted what is marked NeededByPendingPG here), but the "deleting" one, which
# guards what already held.
SAFER = [
    ("item 6: a Ray node whose pod is gone is not capacity that stays",
     world().worker("ghost", pod=False, idle_for_s=IDLE).worker("w1", idle_for_s=IDLE).pg_pending([G8]),
     {"w1": R.NEEDED_BY_PENDING_PG}),
    ("item 6: nor is one whose pod is deleting",
     world().worker("gone", deleting=True, idle_for_s=IDLE).worker("w1", idle_for_s=IDLE).pg_pending([G8]),
     {"gone": R.ALREADY_DELETING, "w1": R.NEEDED_BY_PENDING_PG}),
    ("item 7: PACK [{GPU:1}, {GPU:1, zone:a}] on two 1-GPU workers at maxReplicas keeps both",
     world().group("gpu", max_replicas=2, gpus=1).worker("w1", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "a"})
     .worker("w2", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "b"})
     .pg_pending([{"GPU": 1}, {"GPU": 1}], selectors=[{}, {"zone": "a"}]),
     {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.NEEDED_BY_PENDING_PG}),
    ("item 7: SPREAD with the same selectors, same answer",
     world().group("gpu", max_replicas=2, gpus=1).worker("w1", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "a"})
     .worker("w2", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "b"})
     .pg_pending([{"GPU": 1}, {"GPU": 1}], strategy="SPREAD", selectors=[{}, {"zone": "a"}]),
     {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.NEEDED_BY_PENDING_PG}),
    ("item 7: PACK [4,3,3,2,2,2] fills two 8-GPU workers exactly (first fit does not find it)",
     world().group("gpu", max_replicas=2).worker("w1", idle_for_s=IDLE).worker("w2", idle_for_s=IDLE)
     .pg_pending([{"GPU": g} for g in (4, 3, 3, 2, 2, 2)]),
     {"w1": R.NEEDED_BY_PENDING_PG, "w2": R.NEEDED_BY_PENDING_PG}),
]


@pytest.mark.parametrize("case,w,expected", SAFER, ids=[c[0] for c in SAFER])
def test_pending_pg_that_fits_now_keeps_what_it_needs(case, w, expected):
    p = plan(w)
    assert {name: p.decision(name).reason for name in expected} == expected, [p.decision(n).detail for n in expected]
    assert not set(p.deleted_pods) & set(expected)


def test_a_placement_the_planner_cannot_prove_keeps_every_candidate_that_could_host_it(monkeypatch):
    """Out of search budget: neither a placement nor a proof there is none, so nothing it could use goes."""
    import raygpu.plan.reclaim.placement as placement

    monkeypatch.setattr(placement, "BUDGET", 0)
    p = plan(world().group("gpu", max_replicas=2, gpus=1).worker("w1", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "a"})
             .worker("w2", gpus=1, idle_for_s=IDLE, ray_labels={"zone": "b"}).worker("w3", gpus=1, idle_for_s=IDLE,
                                                                                       ray_labels={"zone": "c"})
             .pg_pending([{"GPU": 1}, {"GPU": 1}], selectors=[{"zone": "in(a,b)"}, {"zone": "a"}]))
    assert p.decision("w1").reason is R.NEEDED_BY_PENDING_PG and p.decision("w2").reason is R.NEEDED_BY_PENDING_PG
    assert "cannot prove" in p.decision("w2").detail
    assert p.deleted_pods == ("w3",)


def test_decisions_built_without_validation_are_the_validated_ones():
    """Decision.typed_many and typed_dicts (plan_reclaim's one per pod) equal Decision(...) of the same values, state
    included: fields in order (8 and 8.0 differ in JSON), fields set, extra and private (what pickling and
    copying carry), hash, and a copy with a change."""
    from raygpu.model.reclaim import Decision

    rows = [("w1", "gpu", DecisionAction.KEEP, R.NOT_IDLE_LONG_ENOUGH, "busy", "k8s-1", "ray-1", 8.0, None),
            ("w2", "", DecisionAction.DELETE, R.IDLE, "idle 900s >= timeout 600s", None, None, 0.0, 900.0)]
    names = ("pod_name", "group", "action", "reason", "detail", "k8s_node_name", "ray_node_id", "gpus", "idle_for_s")
    fast = Decision.typed_many(iter(rows))
    assert isinstance(fast, tuple) and len(fast) == 2
    by_dicts = Decision.typed_dicts([dict(zip(names, row)) for row in rows])
    assert by_dicts == fast and [d.__getstate__() for d in by_dicts] == [d.__getstate__() for d in fast]
    for d, row in zip(fast, rows):
        slow = Decision(**dict(zip(names, row)))
        assert d.__getstate__() == slow.__getstate__() and list(d.__dict__) == list(slow.__dict__)
        assert d.model_dump_json() == slow.model_dump_json() and hash(d) == hash(slow)
        assert d.model_copy(update={"detail": "x"}) == slow.model_copy(update={"detail": "x"})
        assert d.model_copy(update={"detail": "x"}).__pydantic_fields_set__ == set(names)


def test_every_decision_of_a_plan_is_the_validated_decision_in_field_order():
    """plan_reclaim writes each pod's Decision fields inline (kept with or without a Ray node, needed by a
    pending PG, deleted): every one is what Decision(...) validates from the same values, fields in field
    order (the JSON comparison of the golden plans does not see the order of ``__dict__``; repr does)."""
    from raygpu.model.reclaim import Decision

    p = plan(world().worker("busy").worker("new", ray=False).worker("idle", idle_for_s=IDLE)
             .worker("young", idle_for_s=IDLE, age_s=10, gpus=0.5).worker("held", idle_for_s=IDLE, gpus=1)
             .pg_pending([{"GPU": 1}]))
    reasons = {d.reason for d in p.decisions}
    assert {R.HEAD, R.NOT_IDLE_LONG_ENOUGH, R.IDLE, R.STARTUP_GRACE, R.NEEDED_BY_PENDING_PG} <= reasons
    for d in p.decisions:
        slow = Decision(**d.__dict__)
        assert list(d.__dict__) == list(Decision.model_fields) and d.__getstate__() == slow.__getstate__()
        assert repr(d) == repr(slow) and d.model_dump_json() == slow.model_dump_json()


# A pod with two live Ray nodes (Ray restarted inside it while the old node is still reported alive): the
# pod is judged by all of them. 'n-w1' is the old node; 'n-w1-z' (the larger id) the new, idle one.
TWINS = [
    ("a bundle on the pod's other Ray node", world().worker("w1", idle_for_s=IDLE).ray_node("w1", "n-w1-z", idle_for_s=IDLE)
     .pg([G8], state="CREATED", on=["w1"]), R.HOLDS_BUNDLE),
    ("a bundle on the larger node id", world().worker("w1", idle_for_s=IDLE).ray_node("w1", "n-w1-z", idle_for_s=IDLE)
     .pg([G8], state="CREATED", on=["w1-z"]), R.HOLDS_BUNDLE),
    ("the other Ray node is busy", world().worker("w1").ray_node("w1", "n-w1-z", idle_for_s=IDLE),
     R.NOT_IDLE_LONG_ENOUGH),
    ("the other Ray node idle for less than the timeout", world().worker("w1", idle_for_s=300)
     .ray_node("w1", "n-w1-z", idle_for_s=IDLE), R.NOT_IDLE_LONG_ENOUGH),
    ("both idle past the timeout", world().worker("w1", idle_for_s=IDLE).ray_node("w1", "n-w1-z", idle_for_s=IDLE),
     R.IDLE),
]


@pytest.mark.parametrize("case,w,expected", TWINS, ids=[c[0] for c in TWINS])
def test_a_pod_is_judged_by_all_its_live_ray_nodes(case, w, expected):
    (d,) = [d for d in plan(w).decisions if d.pod_name == "w1"]
    assert d.reason == expected, d.detail
    assert d.ray_node_id == "n-w1-z"  # the decision still names the larger node id


def test_a_bundle_on_the_other_ray_node_is_named_in_the_detail():
    w = world().worker("w1", idle_for_s=IDLE).ray_node("w1", "n-w1-z", idle_for_s=IDLE).pg([G8], state="CREATED", on=["w1"])
    (d,) = [d for d in plan(w).decisions if d.pod_name == "w1"]
    assert "pg0" in d.detail and "n-w1" in d.detail
