"""plan/guard.py: the starvation guard's pure decisions (election, nodes, placeholder units, hold steps)."""

from __future__ import annotations

import pytest

from raygpu.model.gang import NodeFree
from raygpu.model.guard import HoldUnit, LeaseView, Placeholder, WaitingGang, parse_guard_policy
from raygpu.plan.guard import LeaseAction, choose_nodes, decide_lease, hold_units, plan_hold, queue_order, split_units

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


def test_units_sum_to_exactly_the_pod_and_hold_one_gpu_each():
    pod = {GPU: 8.0, "cpu": 7.5, "memory": 64 * 2**30 + 3, "example.com/nic": 1.0}
    units = split_units(pod, GPU)
    assert len(units) == 8 and all(u[GPU] == 1.0 for u in units)
    for r, v in pod.items():
        assert sum(u.get(r, 0.0) for u in units) == pytest.approx(v, abs=1e-9), r
    assert split_units({"cpu": 4.0}, None) == [{"cpu": 4.0}]  # no GPUs: one unit of the whole shape
    assert split_units({GPU: 0.5, "cpu": 1.0}, GPU) == [{GPU: 0.5, "cpu": 1.0}]


def test_nodes_with_the_most_free_gpus_are_chosen_and_a_pod_never_goes_where_it_cannot_fit():
    def node(name, free, alloc=8.0):
        return NodeFree(name=name, free={GPU: free, "cpu": 64.0}, allocatable={GPU: alloc, "cpu": 64.0})
    nodes = [node("n1", 2), node("n2", 7), node("n3", 5), node("small", 4, alloc=4)]
    assert choose_nodes({GPU: 8.0, "cpu": 8.0}, 2, nodes, GPU) == ("n2", "n3")
    assert choose_nodes({GPU: 8.0}, 4, nodes, GPU) is None  # three 8-GPU nodes for four pods
    assert choose_nodes({GPU: 4.0}, 2, [node("n1", 8)], GPU) == ("n1", "n1")  # one node holds two pods


def test_a_hold_creates_what_is_missing_swaps_when_all_hold_and_times_out_past_max_hold():
    units = hold_units("g-ph", {GPU: 2.0}, ("n1", "n2"), GPU)
    assert [(u.name, u.node) for u in units] == [("g-ph-0-0", "n1"), ("g-ph-0-1", "n1"), ("g-ph-1-0", "n2"),
                                                 ("g-ph-1-1", "n2")]
    some = [Placeholder(name="g-ph-0-0", node="n1", bound=True)]
    step = plan_hold(units, some, held_for_s=10, max_hold_s=90)
    assert not step.swap and [u.name for u in step.to_create] == ["g-ph-0-1", "g-ph-1-0", "g-ph-1-1"]
    all_bound = [Placeholder(name=u.name, node=u.node, bound=True) for u in units]
    assert plan_hold(units, all_bound, 10, 90).swap
    leaving = all_bound[:-1] + [all_bound[-1].model_copy(update={"deleting": True})]
    assert not plan_hold(units, leaving, 10, 90).swap  # a placeholder being deleted holds nothing
    late = plan_hold(units, all_bound, 91, 90)
    assert late.timed_out and not late.swap and not late.to_create


def test_guard_annotations_never_raise_and_fall_back_to_defaults():
    policy, problems = parse_guard_policy({"raygpu.io/guard": "on", "raygpu.io/max-hold": "90s",
                                           "raygpu.io/guard-scope": "pool-a"})
    assert (policy.enabled, policy.max_hold_s, policy.scope_for("ns")) == (True, 90.0, "pool-a") and not problems
    policy, problems = parse_guard_policy({"raygpu.io/guard": "maybe", "raygpu.io/max-hold": "-3m"})
    assert (policy.enabled, policy.max_hold_s) == (False, 900.0)
    assert sorted(p.key for p in problems) == ["raygpu.io/guard", "raygpu.io/max-hold"]
    assert parse_guard_policy(None)[0].lease_name("team-a") == "raygpu-guard-team-a"
    assert isinstance(HoldUnit(name="x", node="n"), HoldUnit)
