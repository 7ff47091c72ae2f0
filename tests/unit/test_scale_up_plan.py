"""Gang scale-up's pure decisions: ``plan_scale_up`` (which pending placement groups get a reservation) and the
garbage collector's verdicts on the reservations it made (``plan_gc``'s scale-up rules)."""

from __future__ import annotations

import pytest

from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.gang import Strategy
from raygpu.model.gc import GcAction, GcReason, ReservationRecord, SeenAt
from raygpu.model.labels import CREATED_BY_SCALE_UP, LABEL_RESERVATION
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import PgState, PlacementGroupView, RayNodeView, RayView
from raygpu.plan.reclaim.gc import INCOMPLETE_AFTER_S, pgs_on_groups, plan_gc
from raygpu.plan.reclaim.placement import Steps
from raygpu.plan.scale_up import GRACE_S, plan_scale_up, scale_up_name
from raygpu.testing.builders.recorded import NOW_S, RECORDED

CLUSTER = RayClusterView.from_k8s(RECORDED)
POLICY, _ = parse_cluster_policy({"raygpu.io/gang-scale-up": "on"})
PG_A = "a1" * 9  # 18 bytes of hex, as Ray's ids
PG_B = "b2" * 9
PG_C = "c3" * 9


def pg(pg_id: str, n: int = 4, gpus: float = 8, state: PgState = PgState.PENDING, strategy: str = "STRICT_SPREAD",
       created_ms: float | None = 1.0, on: tuple[str | None, ...] = (), selectors=()) -> PlacementGroupView:
    return PlacementGroupView(pg_id=pg_id, state=state, strategy=strategy, bundles=({"GPU": gpus},) * n,
                              bundle_node_ids=on or (None,) * n, bundle_label_selectors=selectors,
                              created_ms=created_ms)


def node(node_id: str, gpus_free: float = 0, gpus: float = 8, group: str | None = None, head: bool = False,
         alive: bool = True) -> RayNodeView:
    labels = {LABEL_RESERVATION: group} if group else {}
    return RayNodeView(node_id=node_id, alive=alive, is_head=head, node_type=group or "gpu", labels=labels,
                       total={"GPU": gpus, "CPU": 16}, available={"GPU": gpus_free, "CPU": 16})


def ray(*pgs: PlacementGroupView, nodes: tuple[RayNodeView, ...] = ()) -> RayView:
    return RayView(nodes=(node("head", gpus=0, head=True), *nodes), placement_groups=pgs)


def record(name: str, pg_id: str | None, state: str = "reserved", group: str | None = None, *, mine: bool = True,
           proven: bool = True, heartbeat: float = NOW_S - 100, deadline: float = NOW_S + 500) -> ReservationRecord:
    return ReservationRecord(name=name, namespace=CLUSTER.namespace, group=group or f"rg-{name}", cluster="rc",
                             state=state, placement_group_id=pg_id, uid=f"uid-{name}",
                             owner_uids=(CLUSTER.uid,) if proven else (), heartbeat_at_s=heartbeat,
                             deadline_at_s=deadline, created_by=CREATED_BY_SCALE_UP if mine else None)


def plan(view: RayView, records=(), *, first_seen=None, backoff=None, policy=POLICY, **kw):
    seen = first_seen if first_seen is not None else {p.pg_id: NOW_S - 60 for p in view.placement_groups}
    return plan_scale_up(CLUSTER, policy, view, records, NOW_S, first_seen=seen, backoff_until=backoff or {}, **kw)


# ------------------------------------------------------------------ plan_scale_up
def test_a_pending_gang_that_fits_nowhere_gets_one_reservation_of_its_bundles_and_strategy():
    out = plan(ray(pg(PG_A), nodes=(node("n1"), node("n2"))))
    assert [i.pg_id for i in out.reserve] == [PG_A]
    req = out.reserve[0].request
    assert req.name == scale_up_name(PG_A) == f"pg-{PG_A[:16]}"
    assert [b.resources for b in req.bundles] == [{"GPU": 8.0}] * 4
    assert req.strategy is Strategy.STRICT_SPREAD and req.timeout_s == POLICY.scale_up_timeout_s
    assert req.owner_job is None and req.guard is False and req.cluster == "rc"


def test_a_placement_group_under_the_grace_waits():
    out = plan(ray(pg(PG_A)), first_seen={PG_A: NOW_S - GRACE_S + 1})
    assert out.reserve == () and "grace" in dict(out.waiting)[PG_A]


def test_a_placement_group_that_fits_on_free_workers_is_left_to_ray_and_takes_their_room():
    free = (node("n1", 8), node("n2", 8), node("n3", 8), node("n4", 8))
    out = plan(ray(pg(PG_A, created_ms=1), pg(PG_B, created_ms=2), nodes=free))
    assert "left to Ray" in dict(out.waiting)[PG_A]
    assert [i.pg_id for i in out.reserve] == [PG_B]  # A took the four free nodes: B fits nowhere


def test_free_room_on_a_reservation_node_is_not_counted_for_other_placement_groups():
    nodes = tuple(node(f"r{i}", 8, group="rg-other") for i in range(4))
    out = plan(ray(pg(PG_A), nodes=nodes))
    assert [i.pg_id for i in out.reserve] == [PG_A]


def test_raygpus_own_placement_groups_and_placed_or_removed_ones_are_not_reserved_for():
    own = pg(PG_A, selectors=({LABEL_RESERVATION: "rg-x"},) * 4)
    out = plan(ray(own, pg(PG_B, state=PgState.CREATED, on=("n1",) * 4), pg(PG_C, state=PgState.REMOVED)))
    assert out.reserve == () and out.waiting == ()


def test_one_reservation_per_placement_group_only_proven_records_count():
    assert plan(ray(pg(PG_A)), [record("pg-a", PG_A)]).reserve == ()
    unproven = plan(ray(pg(PG_A)), [record("pg-a", PG_A, proven=False)])
    assert [i.pg_id for i in unproven.reserve] == [PG_A]  # a look-alike ConfigMap claims nothing


def test_oldest_first_and_at_most_in_flight_reservations_waiting_to_be_used():
    policy, _ = parse_cluster_policy({"raygpu.io/gang-scale-up": "on", "raygpu.io/gang-scale-up-in-flight": "2"})
    view = ray(pg(PG_C, created_ms=3), pg(PG_B, created_ms=2), pg(PG_A, created_ms=1))
    out = plan(view, policy=policy)
    assert [i.pg_id for i in out.reserve] == [PG_A, PG_B]
    assert "in flight" in dict(out.waiting)[PG_C]
    # one already in flight (not yet used) leaves room for one more
    out = plan(ray(pg(PG_B, created_ms=2), pg(PG_C, created_ms=3), pg("d4" * 9, created_ms=0)),
               [record("pg-d", "d4" * 9)], policy=policy)
    assert [i.pg_id for i in out.reserve] == [PG_B]


def test_a_placement_group_backing_off_waits():
    out = plan(ray(pg(PG_A)), backoff={PG_A: NOW_S + 30})
    assert out.reserve == () and "backing off" in dict(out.waiting)[PG_A]


def test_when_the_search_budget_is_spent_nothing_more_is_judged_and_the_plan_says_so():
    out = plan(ray(pg(PG_A), pg(PG_B)), steps=Steps(0))
    assert out.reserve == () and out.budget_spent
    assert all("not judged" in why for _, why in out.waiting)


def test_ray_unreachable_plans_nothing():
    out = plan(RayView(reachable=False, reason="timeout"))
    assert out.reserve == () and "cannot be read" in out.note


def test_a_reservation_whose_placement_group_is_created_on_its_pods_is_marked_ready():
    nodes = tuple(node(f"r{i}", 0, group="rg-pg-a") for i in range(4))
    placed = pg(PG_A, state=PgState.CREATED, on=tuple(f"r{i}" for i in range(4)))
    out = plan(ray(placed, nodes=nodes), [record("pg-a", PG_A, group="rg-pg-a")])
    assert out.ready == (("pg-a", PG_A),) and out.reserve == ()


def test_pods_taken_by_another_placement_group_swap_the_two_reservations_targets():
    # Ray placed B (same shape) on the pods reserved for A; B's own reservation is unused: it now waits for A
    nodes = tuple(node(f"r{i}", 0, group="rg-pg-a") for i in range(4))
    b_on_a = pg(PG_B, state=PgState.CREATED, on=tuple(f"r{i}" for i in range(4)))
    out = plan(ray(pg(PG_A), b_on_a, nodes=nodes),
               [record("pg-a", PG_A, group="rg-pg-a"), record("pg-b", PG_B, group="rg-pg-b")])
    assert set(out.retarget) == {("pg-a", PG_B), ("pg-b", PG_A)}
    assert out.reserve == ()  # A has a reservation again (B's former one)


def test_planning_is_linear_enough_for_a_big_backlog():
    pgs = tuple(pg(f"{i:036x}", n=2, created_ms=i) for i in range(3000))
    nodes = tuple(node(f"n{i:05d}", 8 if i % 10 == 0 else 0) for i in range(5000))
    out = plan(ray(*pgs, nodes=nodes))
    assert len(out.reserve) == POLICY.scale_up_in_flight
    assert len(out.waiting) == 3000 - POLICY.scale_up_in_flight


# --------------------------------------------------------------- the GC's verdicts
def gc(records, view: RayView, now_s: float = NOW_S, seen=None):
    at = seen or {r.name: SeenAt(first_s=NOW_S - 100, heartbeat_s=NOW_S - 100) for r in records}
    return {d.reservation: d for d in plan_gc(records, view, now_s, cluster=CLUSTER, jobs={}, seen=at).decisions}


@pytest.mark.parametrize("state,reason", [
    (None, GcReason.PLACEMENT_GROUP_GONE), (PgState.REMOVED, GcReason.PLACEMENT_GROUP_GONE),
    (PgState.CREATED, GcReason.PLACED_ELSEWHERE), (PgState.PENDING, GcReason.LIVE)])
def test_a_scale_up_reservation_is_judged_by_its_placement_group(state, reason):
    pgs = () if state is None else (pg(PG_A, state=state, on=("elsewhere",) * 4 if state is PgState.CREATED else ()),)
    d = gc([record("pg-a", PG_A)], ray(*pgs))["pg-a"]
    assert d.reason is reason
    assert (d.action is GcAction.KEEP) == (reason is GcReason.LIVE)


def test_a_scale_up_reservation_still_pending_past_its_deadline_times_out_on_the_sidecars_clock():
    # deadline 500 s after the heartbeat the sidecar saw 100 s ago: 400 s left on its clock, whatever the stamps say
    r = record("pg-a", PG_A, heartbeat=10.0, deadline=510.0)
    assert gc([r], ray(pg(PG_A)))["pg-a"].reason is GcReason.LIVE
    assert gc([r], ray(pg(PG_A)), now_s=NOW_S + 401)["pg-a"].reason is GcReason.TIMED_OUT


def test_a_scale_up_reservation_holding_a_bundle_is_never_released():
    nodes = (node("r0", 0, group="rg-pg-a"),)
    on_it = pg(PG_B, n=1, state=PgState.CREATED, on=("r0",))
    for view in (ray(on_it, nodes=nodes), ray(on_it, pg(PG_A, state=PgState.REMOVED), nodes=nodes)):
        d = gc([record("pg-a", PG_A, group="rg-pg-a", deadline=NOW_S - 1000)], view)["pg-a"]
        assert d.action is GcAction.KEEP and d.reason is GcReason.IN_USE


def test_a_scale_up_reservation_has_no_heartbeat_to_lose_and_ray_unreachable_keeps_it():
    stale = record("pg-a", PG_A, heartbeat=0.0, deadline=10 ** 9)
    d = gc([stale], ray(pg(PG_A)), seen={"pg-a": SeenAt(first_s=0.0, heartbeat_s=0.0)}, now_s=NOW_S)["pg-a"]
    assert d.reason is not GcReason.HEARTBEAT_LOST
    assert gc([stale], RayView(reachable=False))["pg-a"].action is GcAction.KEEP


def test_a_half_made_scale_up_reservation_is_rolled_back_after_a_while():
    r = record("pg-a", PG_A, state="planned", group="rg-pg-a")  # no such worker group in the spec
    fresh = {"pg-a": SeenAt(first_s=NOW_S - 5, heartbeat_s=NOW_S - 5)}
    assert gc([r], ray(pg(PG_A)), seen=fresh)["pg-a"].reason is GcReason.LIVE
    old = {"pg-a": SeenAt(first_s=NOW_S - INCOMPLETE_AFTER_S - 1, heartbeat_s=NOW_S - INCOMPLETE_AFTER_S - 1)}
    assert gc([r], ray(pg(PG_A)), seen=old)["pg-a"].reason is GcReason.INCOMPLETE


def test_a_drivers_reservation_is_still_judged_by_its_heartbeat_and_job():
    driver = record("job", PG_A, mine=False, heartbeat=NOW_S - 1000)
    d = gc([driver], ray(), seen={"job": SeenAt(first_s=0.0, heartbeat_s=0.0)})["job"]
    assert d.reason is GcReason.PLACEMENT_GROUP_GONE  # rule 3, as before: its PG is not in Ray's table


def test_pgs_on_groups_maps_bundles_to_reservation_groups_by_ray_label_or_node_type():
    view = RayView(nodes=(node("r0", group="rg-a"), RayNodeView(node_id="r1", alive=True, node_type="rg-b"),
                          node("w0")),
                   placement_groups=(pg(PG_A, n=3, state=PgState.CREATED, on=("r0", "r1", "w0")),
                                     pg(PG_B, n=1, state=PgState.REMOVED, on=("r0",))))
    assert pgs_on_groups(view) == {"rg-a": {PG_A}, "rg-b": {PG_A}}


def test_an_unused_reservation_follows_a_placement_group_recreated_with_the_same_shape():
    # Ray Train removes a workers' PG not ready in time and creates it again under a new id
    old = pg(PG_A, state=PgState.REMOVED).model_copy(update={"creator_job_id": "01000000"})
    other_job = pg(PG_C, created_ms=1).model_copy(update={"creator_job_id": "02000000"})
    again = pg(PG_B, created_ms=2).model_copy(update={"creator_job_id": "01000000"})
    out = plan(ray(old, other_job, again), [record("pg-a", PG_A)])
    assert out.retarget == (("pg-a", PG_B),)  # the same creator's, though C is older
    assert [i.pg_id for i in out.reserve] == [PG_C]  # B is covered; C gets its own
    other_shape = pg(PG_B, n=2).model_copy(update={"creator_job_id": "01000000"})
    out = plan(ray(old, other_shape), [record("pg-a", PG_A)])
    assert out.retarget == () and [i.pg_id for i in out.reserve] == [PG_B]


def test_gpu_groups_the_in_tree_autoscaler_could_grow_pod_by_pod_are_named():
    from raygpu.model.raycluster import GroupTemplate
    from raygpu.plan.scale_up import autoscaler_risks
    gpu = GroupTemplate(group_name="gpu", max_replicas=16, limits={"nvidia.com/gpu": 8})
    cpu = GroupTemplate(group_name="cpu", max_replicas=64, limits={"cpu": 16})
    single = GroupTemplate(group_name="one", max_replicas=1, limits={"nvidia.com/gpu": 1})
    template = GroupTemplate(group_name="gpu", max_replicas=0, limits={"nvidia.com/gpu": 8})
    rg = GroupTemplate(group_name="rg-pg-x", replicas=4, min_replicas=4, max_replicas=4, limits={"nvidia.com/gpu": 8})
    on = {"autoscaling_enabled": True}
    assert autoscaler_risks(CLUSTER.model_copy(update={**on, "worker_groups": (gpu, cpu)})) == [("gpu", 16)]
    assert autoscaler_risks(CLUSTER.model_copy(update={**on, "worker_groups": (template, single, cpu, rg)})) == []
    two_singles = (single, single.model_copy(update={"group_name": "two"}))
    assert len(autoscaler_risks(CLUSTER.model_copy(update={**on, "worker_groups": two_singles}))) == 2
    assert autoscaler_risks(CLUSTER.model_copy(update={"autoscaling_enabled": False, "worker_groups": (gpu,)})) == []


# ------------------------------------------------------------------ bundle label selectors
def labelled_cluster(**group_labels: dict) -> RayClusterView:
    import copy
    rc = copy.deepcopy(RECORDED)
    for g in rc["spec"]["workerGroupSpecs"]:
        if g["groupName"] in group_labels:
            g["labels"] = group_labels[g["groupName"]]
    return RayClusterView.from_k8s(rc)


@pytest.mark.parametrize("selector,labels,matches", [
    ({"gpu": "h100"}, {"gpu": "h100"}, True),
    ({"gpu": "h100"}, {"gpu": "a100"}, False),
    ({"gpu": "h100"}, {}, False),
    ({"gpu": "!h100"}, {}, True),
    ({"gpu": "!h100"}, {"gpu": "h100"}, False),
    ({"gpu": "in(a100, h100)"}, {"gpu": "h100"}, True),
    ({"gpu": "in(a100,h100)"}, {"gpu": "t4"}, False),
    ({"gpu": "!in(a100, h100)"}, {"gpu": "t4"}, True),
    ({"gpu": "!in(a100, h100)"}, {"gpu": "a100"}, False),
    ({"gpu": "h100", "zone": "z1"}, {"gpu": "h100"}, False),
])
def test_ray_label_selector_syntax(selector, labels, matches):
    from raygpu.plan.scale_up import label_selector_matches
    assert label_selector_matches(selector, labels) is matches


def test_a_placement_group_with_bundle_label_selectors_copies_the_group_whose_ray_labels_satisfy_them():
    cluster = labelled_cluster(gpu={"gpu": "a100"}, small={"gpu": "h100"})
    view = ray(pg(PG_A, n=2, gpus=1, selectors=({"gpu": "h100"},) * 2), nodes=(node("n1"),))
    out = plan_scale_up(cluster, POLICY, view, (), NOW_S, first_seen={PG_A: NOW_S - 60}, backoff_until={})
    assert [(i.pg_id, i.template) for i in out.reserve] == [(PG_A, "small")]
    # without selectors the planner chooses the template, as for any gang
    out = plan_scale_up(cluster, POLICY, ray(pg(PG_B)), (), NOW_S, first_seen={PG_B: NOW_S - 60}, backoff_until={})
    assert [(i.pg_id, i.template) for i in out.reserve] == [(PG_B, None)]


def test_a_placement_group_whose_selectors_no_group_satisfies_gets_no_reservation_and_the_plan_says_why():
    cluster = labelled_cluster(gpu={"gpu": "a100"})
    view = ray(pg(PG_A, selectors=({"gpu": "h100"},) * 4))
    out = plan_scale_up(cluster, POLICY, view, (), NOW_S, first_seen={PG_A: NOW_S - 60}, backoff_until={})
    assert out.reserve == ()
    assert [(p, "gpu=h100" in why and "labels" in why) for p, why in out.waiting] == [(PG_A, True)]


def test_free_workers_its_selectors_do_not_allow_do_not_count_as_room_for_it():
    cluster = labelled_cluster(gpu={"gpu": "h100"})
    free = (node("n1", gpus_free=8), node("n2", gpus_free=8))  # Ray nodes without the label, free
    view = ray(pg(PG_A, n=2, selectors=({"gpu": "h100"},) * 2), nodes=free)
    out = plan_scale_up(cluster, POLICY, view, (), NOW_S, first_seen={PG_A: NOW_S - 60}, backoff_until={})
    assert [(i.pg_id, i.template) for i in out.reserve] == [(PG_A, "gpu")]
    # the same free workers with no selector: it fits, left to Ray
    out = plan(ray(pg(PG_B, n=2), nodes=free))
    assert out.reserve == () and "fits" in out.waiting[0][1]
