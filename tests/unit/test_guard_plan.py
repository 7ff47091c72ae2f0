"""plan/guard.py: the starvation guard's pure decisions (election, nodes, blockers, hold steps)."""

from __future__ import annotations

import pytest

from raygpu.model.gang import NodeFree
from raygpu.model.guard import Blocker, HoldUnit, LeaseView, WaitingGang, parse_guard_policy
from raygpu.plan.guard import LeaseAction, blocker_units, choose_nodes, decide_lease, need_by_node, plan_hold, queue_order

GPU = "nvidia.com/gpu"


def w(name: str, created: float, state: str = "reserved", timeouts: int = 0) -> WaitingGang:
    return WaitingGang(name=name, created_at_s=created, state=state, timeouts=timeouts)


def lease(holder: str, rv: str = "7") -> LeaseView:
    return LeaseView(name="raygpu-guard-default", namespace="default", resource_version=rv, holder=holder,
                     lease_duration_s=30)


LINE = [w("b", 20), w("a", 10), w("c", 5, state="ready"), w("d", 1, timeouts=1)]

ELECTION = [  # me, lease, gangs, unchanged_for_s, expected action
    ("a", None, LINE, 0, LeaseAction.CREATE),  # oldest waiting without a timeout ("c" is ready, "d" timed out)
    ("b", None, LINE, 0, LeaseAction.WAIT),  # not first in line
    ("a", lease(""), LINE, 0, LeaseAction.ACQUIRE),  # released
    ("a", lease("b"), LINE, 29, LeaseAction.WAIT),  # b holds and renewed recently (on our clock)
    ("a", lease("b"), LINE, 31, LeaseAction.ACQUIRE),  # b has not renewed for longer than the lease
    ("a", lease("c"), LINE, 0, LeaseAction.ACQUIRE),  # the holder no longer waits (it is ready): no clock needed
    ("a", lease("gone"), LINE, 0, LeaseAction.ACQUIRE),  # the holder's state ConfigMap is gone
    ("b", lease("b"), LINE, 0, LeaseAction.RENEW),  # we hold it (even if no longer first)
    ("d", None, [w("d", 1, timeouts=1)], 0, LeaseAction.CREATE),  # alone, a timed-out gang is first again
]


@pytest.mark.parametrize("me,held,gangs,unchanged,want", ELECTION)
def test_only_the_first_in_line_takes_a_free_lease(me, held, gangs, unchanged, want):
    assert decide_lease(me, held, gangs, unchanged).action == want


def test_queue_order_is_timeouts_then_api_server_creation_then_name():
    assert [g.name for g in queue_order(LINE + [w("a2", 10)])] == ["a", "a2", "b", "d"]


def test_one_blocker_per_distinct_node_and_the_need_per_node_sums_the_pods_chosen_for_it():
    assert [(u.name, u.node) for u in blocker_units("g-bl", ("n2", "n1", "n2"))] == [("g-bl-0", "n1"), ("g-bl-1", "n2")]
    assert need_by_node({GPU: 4.0, "cpu": 1.0}, ("n1", "n1", "n2")) == {"n1": {GPU: 8.0, "cpu": 2.0},
                                                                        "n2": {GPU: 4.0, "cpu": 1.0}}


def test_nodes_with_the_most_free_gpus_are_chosen_and_a_pod_never_goes_where_it_cannot_fit():
    def node(name, free, alloc=8.0):
        return NodeFree(name=name, free={GPU: free, "cpu": 64.0}, allocatable={GPU: alloc, "cpu": 64.0})
    nodes = [node("n1", 2), node("n2", 7), node("n3", 5), node("small", 4, alloc=4)]
    assert choose_nodes({GPU: 8.0, "cpu": 8.0}, 2, nodes, GPU) == ("n2", "n3")
    assert choose_nodes({GPU: 8.0}, 4, nodes, GPU) is None  # three 8-GPU nodes for four pods
    assert choose_nodes({GPU: 4.0}, 2, [node("n1", 8)], GPU) == ("n1", "n1")  # one node holds two pods


def test_a_hold_creates_missing_blockers_swaps_only_when_all_hold_and_the_gang_fits_and_times_out():
    units = blocker_units("g-bl", ("n1", "n2"))
    need = need_by_node({GPU: 8.0}, ("n1", "n2"))
    room = {"n1": {GPU: 8.0}, "n2": {GPU: 8.0}}
    some = [Blocker(name="g-bl-0", node="n1")]
    step = plan_hold(units, some, room, need, held_for_s=10, max_hold_s=90)
    assert not step.swap and [u.name for u in step.to_create] == ["g-bl-1"]
    both = [Blocker(name=u.name, node=u.node) for u in units]
    assert plan_hold(units, both, room, need, 10, 90).swap
    short = plan_hold(units, both, {"n1": {GPU: 8.0}, "n2": {GPU: 7.0}}, need, 10, 90)
    assert not short.swap and short.short == ("n2",) and not short.to_create  # a GPU on n2 still busy
    assert not plan_hold(units, both, {"n1": {GPU: 8.0}}, need, 10, 90).swap  # n2 gone or cordoned
    for bad in ({"deleting": True}, {"ended": True}, {"node": "n9"}):  # leaving, refused, elsewhere: blocks nothing
        assert not plan_hold(units, both[:-1] + [both[-1].model_copy(update=bad)], room, need, 10, 90).swap
    late = plan_hold(units, both, room, need, 91, 90)
    assert late.timed_out and not late.swap and not late.to_create
    assert not plan_hold([], [], {}, {}, 10, 90).swap  # nothing chosen: never a swap of nothing


def test_guard_annotations_never_raise_and_fall_back_to_defaults():
    policy, problems = parse_guard_policy({"raygpu.io/guard": "on", "raygpu.io/max-hold": "90s",
                                           "raygpu.io/guard-scope": "pool-a"})
    assert (policy.enabled, policy.max_hold_s, policy.scope_for("ns")) == (True, 90.0, "pool-a") and not problems
    policy, problems = parse_guard_policy({"raygpu.io/guard": "maybe", "raygpu.io/max-hold": "-3m"})
    assert (policy.enabled, policy.max_hold_s) == (False, 900.0)
    assert sorted(p.key for p in problems) == ["raygpu.io/guard", "raygpu.io/max-hold"]
    assert parse_guard_policy(None)[0].lease_name("team-a") == "raygpu-guard-team-a"
    assert isinstance(HoldUnit(name="x", node="n"), HoldUnit)


def test_guard_keys_are_cluster_policy_keys_a_misspelt_one_is_a_problem_and_max_hold_is_bounded():
    from raygpu.model.annotations import parse_cluster_policy
    policy, problems = parse_cluster_policy({"raygpu.io/gaurd": "on", "raygpu.io/max-hld": "90s",
                                             "raygpu.io/guard-scop": "pool"})
    assert sorted(p.key for p in problems) == ["raygpu.io/gaurd", "raygpu.io/guard-scop", "raygpu.io/max-hld"]
    assert not policy.guard.enabled and policy.guard.max_hold_s == 900.0 and policy.guard.scope is None
    policy, problems = parse_cluster_policy({"raygpu.io/guard": "on", "raygpu.io/max-hold": "2m",
                                             "raygpu.io/guard-scope": "pool"})
    assert (policy.guard.enabled, policy.guard.max_hold_s, policy.guard.scope, problems) == (True, 120.0, "pool", [])
    for bad in ("1ms", "29s", "100000h", "6h1s"):  # 30 s .. 6 h
        policy, problems = parse_cluster_policy({"raygpu.io/max-hold": bad})
        assert policy.guard.max_hold_s == 900.0 and [p.key for p in problems] == ["raygpu.io/max-hold"], bad
    for good, s in (("30s", 30.0), ("6h", 21600.0)):
        assert parse_cluster_policy({"raygpu.io/max-hold": good})[0].guard.max_hold_s == s


@pytest.mark.parametrize("raw,want", [("1.0", 1), ("2", 2), ("-4", 0), ("x", 0), ("1e30", 1000), ("nan", 0), ("inf", 0)])
def test_a_state_objects_timeout_count_is_read_bounded_and_never_raises(raw, want):
    cm = {"metadata": {"name": "g", "annotations": {"raygpu.io/guard-timeouts": raw}}}
    assert WaitingGang.from_k8s(cm).timeouts == want


def test_choosing_nodes_computes_each_nodes_fit_time_once_plus_once_per_pod_not_once_per_pod_and_node(monkeypatch):
    import raygpu.plan.guard as plan_guard
    from raygpu.model.views import K8sPodView
    calls = []
    real = plan_guard.fit_time_s

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(plan_guard, "fit_time_s", counted)
    n_nodes, n_pods = 2000, 40
    nodes = [NodeFree(name=f"n{i:05d}", free={GPU: float(i % 8), "cpu": 64.0}, allocatable={GPU: 8.0, "cpu": 64.0})
             for i in range(n_nodes)]
    pods = {n.name: [K8sPodView(name=f"p{n.name}", namespace="t", node_name=n.name, phase="Running",
                                requests={GPU: 8.0 - n.free[GPU]})] for n in nodes}
    chosen = choose_nodes({GPU: 8.0, "cpu": 1.0}, n_pods, nodes, GPU, pods, now_s=0.0)
    assert chosen is not None and len(chosen) == n_pods and len(set(chosen)) == n_pods
    assert len(calls) <= n_nodes + 2 * n_pods  # quadratic would be n_pods * n_nodes = 80,000
    # the same choice as before: most GPUs free now (7 of 8), then the name
    assert list(chosen) == sorted(n.name for n in nodes if n.free[GPU] == 7.0)[:n_pods]


def test_a_ticket_unchanged_for_its_duration_is_gone_ours_never_and_only_gone_gangs_blockers_are_deleted():
    from raygpu.model.guard import Ticket
    from raygpu.plan.guard import blockers_to_clear, live_tickets
    a, b, me = (Ticket(name=f"l.{t}", uid=f"u-{t}", tag=t) for t in ("a", "b", "me"))
    live, gone = live_tickets([a, b, me], {"l.a": 31.0, "l.b": 30.0, "l.me": 999.0}, "me")
    assert [t.tag for t in live] == ["b", "me"] and [t.tag for t in gone] == ["a"]
    bl = [Blocker(name="x", node="n1", owner_uid="u-a"), Blocker(name="y", node="n2", owner_uid="u-b"),
          Blocker(name="z", node="n3", owner_uid="u-me"), Blocker(name="w", node="n4", owner_uid="")]
    delete, wait = blockers_to_clear(bl, {t.uid for t in live}, "u-me")
    assert [x.name for x in delete] == ["x", "w"] and [x.name for x in wait] == ["y"]


def test_only_a_proven_ticket_of_the_scope_is_read_as_a_gang_in_line():
    from raygpu.model.guard import Ticket
    good = {"metadata": {"name": "raygpu-guard-s.t1", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"raygpu.io/guard-ticket": "s", "raygpu.io/guard-scope": "s"}},
            "spec": {"holderIdentity": "t1", "renewTime": "r"}}
    assert Ticket.from_k8s(good, "s", "raygpu-guard-s").tag == "t1"
    import copy
    for mutate in (lambda o: o["metadata"]["labels"].pop("raygpu.io/guard-ticket"),
                   lambda o: o["metadata"]["labels"].update({"raygpu.io/guard-scope": "other"}),
                   lambda o: o["metadata"].update(name="raygpu-guard-s.t2"),
                   lambda o: o["spec"].pop("holderIdentity"),
                   lambda o: o["metadata"].update(creationTimestamp="yesterday")):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert Ticket.from_k8s(bad, "s", "raygpu-guard-s") is None


def test_the_sidecars_gauges_read_the_timeout_count_with_the_same_bounded_parser():
    from raygpu.model.gc import ReservationRecord
    cm = {"metadata": {"name": "g", "annotations": {"raygpu.io/guard-timeouts": "1.0"}}}
    assert ReservationRecord.from_configmap(cm).guard_timeouts == 1
