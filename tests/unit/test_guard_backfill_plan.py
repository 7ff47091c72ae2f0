"""plan/backfill.py and choose_nodes with runtime hints (issue 11 item 2): estimated ends, fit times, a
hold's estimated start, who may backfill, the clock-skew margin. Pure: every time is an argument."""

from __future__ import annotations

import pytest

from raygpu.model.gang import NodeFree
from raygpu.model.guard import Ask, format_grants, parse_grants
from raygpu.model.views import K8sPodView
from raygpu.plan.backfill import (BACKFILL_MARGIN_S, decide_backfill, decide_pass, estimated_start_s, fit_time_s, hint_s,
                                  pod_end_s)
from raygpu.plan.guard import choose_nodes

GPU = "nvidia.com/gpu"
NOW = 1_000_000.0
ALLOC = {GPU: 8.0, "cpu": 64.0}


def pod(name: str, gpus: float, *, start: float | None = NOW - 100, ads: float | None = None,
        hint: str | None = None, raygpu: bool = True, phase: str = "Running") -> K8sPodView:
    """A pod on a node: ``ads`` its activeDeadlineSeconds, ``hint`` raygpu's expected-runtime annotation
    (honoured only on a pod raygpu made: label raygpu.io/reservation)."""
    return K8sPodView(name=name, namespace="ns", node_name="n", phase=phase, started_at_s=start,
                      active_deadline_s=ads, requests={GPU: gpus, "cpu": 1.0},
                      labels={"raygpu.io/reservation": "rg-x"} if raygpu else {},
                      annotations={"raygpu.io/expected-runtime-s": hint} if hint is not None else {})


@pytest.mark.parametrize("p, want", [
    (pod("ads", 1, ads=300), NOW + 200),  # startTime + activeDeadlineSeconds
    (pod("hint", 1, hint="150"), NOW + 50),  # raygpu's hint on raygpu's pod
    (pod("both", 1, ads=300, hint="150"), NOW + 50),  # the sooner bound
    (pod("foreign", 1, hint="150", raygpu=False), None),  # anyone else's annotation is not believed
    (pod("no-bound", 1), None),  # no hint, no deadline: unknown
    (pod("bad-hint", 1, hint="soon"), None),
    (pod("overran", 1, ads=50), NOW),  # past its end, still running: it may end any moment, never "in the past"
    (pod("not-started", 1, start=None, ads=60), NOW + 60),  # counts from now
])
def test_a_pods_estimated_end(p, want):
    assert pod_end_s(p, NOW) == want


def test_only_raygpu_pods_carry_a_hint():
    assert hint_s(pod("a", 1, hint="12.5")) == 12.5
    assert hint_s(pod("a", 1, hint="12.5", raygpu=False)) is None
    assert hint_s(pod("a", 1, hint="inf")) is None


@pytest.mark.parametrize("pods, need, want", [
    ([], 8, NOW),  # an empty node: now
    ([pod("a", 4, ads=200)], 4, NOW),  # room now beside it
    ([pod("a", 4, ads=200), pod("b", 4, ads=400)], 4, NOW + 100),  # the first to end frees enough
    ([pod("a", 4, ads=200), pod("b", 4, ads=400)], 8, NOW + 300),  # both must end
    ([pod("a", 4, ads=200), pod("b", 4)], 8, None),  # b never ends (no hint): unknown
    ([pod("a", 4, ads=200), pod("b", 4, phase="Succeeded")], 8, NOW + 100),  # an ended pod holds nothing
    ([], 9, None),  # more than the node has
])
def test_a_nodes_fit_time(pods, need, want):
    assert fit_time_s(ALLOC, pods, {GPU: float(need)}, NOW) == want


def test_a_holds_estimated_start_is_its_latest_node_and_unknown_if_any_node_is():
    pods = {"n1": [pod("a", 8, ads=200)], "n2": [pod("b", 8, hint="400")]}
    need = {"n1": {GPU: 8.0}, "n2": {GPU: 8.0}}
    assert estimated_start_s(need, {"n1": ALLOC, "n2": ALLOC}, pods, NOW) == NOW + 300
    assert estimated_start_s(need, {"n1": ALLOC}, pods, NOW) is None  # n2 is gone
    pods["n2"] = [pod("b", 8)]  # no hint: the hold's start is unknown
    assert estimated_start_s(need, {"n1": ALLOC, "n2": ALLOC}, pods, NOW) is None


@pytest.mark.parametrize("runtime_s, start_s, want", [
    (60, NOW + 60 + BACKFILL_MARGIN_S, True),  # ends exactly a margin before the start
    (60, NOW + 60 + BACKFILL_MARGIN_S - 1, False),  # one second too long
    (600, NOW + 300, False),
    (None, NOW + 10_000, False),  # no hint: never backfills
    (60, None, False),  # the hold's start is unknown
])
def test_backfill_needs_a_hint_that_ends_a_margin_before_the_holds_start(runtime_s, start_s, want):
    d = decide_backfill("me", "holder", start_s, runtime_s, NOW)
    assert (d.pass_for == "holder") is want, d.reason


def test_no_pass_without_another_holder():
    assert decide_backfill("me", "", NOW + 999, 1, NOW).pass_for is None
    assert decide_backfill("me", "me", NOW + 999, 1, NOW).pass_for is None


def test_the_margin_covers_a_driver_clock_behind_the_kubelets():
    # a fake clock: the kubelet's is true time; the driver's runs 25 s behind (within the 30 s margin)
    true_now, driver_now = NOW, NOW - 25
    start = estimated_start_s({"n": {GPU: 8.0}}, {"n": ALLOC}, {"n": [pod("a", 8, ads=200)]}, true_now)
    assert start == NOW + 100  # the kubelet started a at NOW - 100; its deadline ends it at NOW + 100

    def allowed(margin_s: float) -> list[int]:
        return [r for r in range(1, 300) if decide_backfill("me", "h", start, r, driver_now, margin_s).pass_for]
    assert max(allowed(BACKFILL_MARGIN_S)) == 95  # -25 + 95 + 30 = 100
    assert true_now + max(allowed(BACKFILL_MARGIN_S)) <= start  # every job let in truly ends before the start
    assert true_now + max(allowed(0)) > start  # without the margin a 125 s job is let in, ending 25 s late


def node(name: str, free: float) -> NodeFree:
    return NodeFree(name=name, free={GPU: free, "cpu": 64.0}, allocatable=dict(ALLOC))


def test_with_no_hints_the_choice_is_the_old_rule_most_gpus_free_now():
    nodes = [node("n1", 2), node("n2", 7), node("n3", 5)]
    pods = {"n1": [pod("a", 6)], "n2": [pod("b", 1)], "n3": [pod("c", 3)]}  # no hints, no deadlines
    old = choose_nodes({GPU: 8.0}, 2, nodes, GPU)
    assert old == ("n2", "n3")
    assert choose_nodes({GPU: 8.0}, 2, nodes, GPU, pods, NOW) == old


def test_known_ends_beat_more_free_gpus_now():
    nodes = [node("n1", 2), node("n2", 7), node("n3", 5)]
    pods = {"n1": [pod("a", 6, ads=130)], "n2": [pod("b", 1)], "n3": [pod("c", 3, hint="500")]}
    # n1 frees at NOW + 30, n3 at NOW + 400, n2 never (an unknown end counts as never)
    assert choose_nodes({GPU: 8.0}, 2, nodes, GPU, pods, NOW) == ("n1", "n3")
    assert choose_nodes({GPU: 8.0}, 3, nodes, GPU, pods, NOW) == ("n1", "n3", "n2")


def test_a_node_taking_two_pods_is_timed_for_both():
    nodes = [node("n1", 4), node("n2", 4)]
    pods = {"n1": [pod("a", 4, ads=200)], "n2": [pod("b", 4, ads=150)]}
    # first pod: both fit now with 4 GPUs free: the name decides (n1)
    got = choose_nodes({GPU: 4.0}, 2, nodes, GPU, pods, NOW)
    assert got == ("n1", "n2")  # the second pod on n1 would wait for a (NOW + 100); on n2 it fits now


PASSES = [  # holder, its answers, waited_s -> pass for, gate lifted
    ("", {}, 0, None, True),  # nobody holds: scheduled as usual
    ("h", {"me": True}, 0, "h", True),  # granted
    ("h", {"me": False}, 0, None, True),  # refused (or revoked)
    ("h", {"other": True}, 0, None, False),  # not answered yet: kept gated, so the first try carries the answer
    ("h", {}, 10, None, True),  # no answer for 10 s: scheduled without a pass
]


@pytest.mark.parametrize("holder,grants,waited,want,lift", PASSES)
def test_a_backfilling_gang_only_acts_on_the_holders_answer(holder, grants, waited, want, lift):
    d = decide_pass("me", holder, grants, waited)
    assert (d.pass_for, d.lift_gate) == (want, lift)


def test_only_a_proven_ask_is_read_and_answers_round_trip():
    good = {"metadata": {"name": "raygpu-guard-s.ask.t", "labels": {"raygpu.io/guard-ask": "raygpu-guard-s"},
                         "annotations": {"raygpu.io/expected-runtime-s": "20", "raygpu.io/guard-ask": "3;2"}},
            "spec": {"holderIdentity": "t"}}
    a = Ask.from_k8s(good, "raygpu-guard-s")
    assert a is not None and (a.tag, a.hint_s, a.seen_rev, a.passes) == ("t", 20.0, 3, 2)
    renamed = {**good, "metadata": {**good["metadata"], "name": "raygpu-guard-s.ask.other"}}
    unlabelled = {**good, "metadata": {**good["metadata"], "labels": {}}}
    assert Ask.from_k8s(renamed, "raygpu-guard-s") is None and Ask.from_k8s(unlabelled, "raygpu-guard-s") is None
    assert parse_grants(format_grants(7, {"a": True, "b": False})) == (7, {"a": True, "b": False})
    assert parse_grants("x;a=yes") == (0, {}) and parse_grants("2;a=maybe,b=yes") == (2, {"b": True})
