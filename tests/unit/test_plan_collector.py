"""The cyclic garbage collector is paused by a caller that owns its process (the sidecar, the doctor), and restored
after; a planner never pauses it itself (plan/common/collector.py)."""

from __future__ import annotations

import gc
import threading

import pytest

from raygpu.plan.common.collector import collector_paused, pauses_collector
from raygpu.plan.reclaim.cycle import plan_cycle
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.gang.reservation import plan_gang
from raygpu.plan.reclaim.gc import plan_gc
from raygpu.plan.doctor.checks_index import index_snapshot
from raygpu.plan.reclaim.scale_down import plan_reclaim


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_restored_after():
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_restore_only_at_the_outermost():
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_restored_when_the_planner_raises():
    @pauses_collector
    def boom():
        assert not gc.isenabled()
        raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    assert gc.isenabled()


def test_overlapping_pauses_in_two_threads_reenable_once_both_end():
    inside, release = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause still runs
    release.set()
    t.join(10)
    assert gc.isenabled()


def _cycle_inputs():
    from benchmarks.bench_decision_cost import (cycle_pgs, gang_cluster, reclaim_cluster, synthetic_snapshot,
                                                with_idle_workers, with_pending)
    from raygpu.model.gang import GangRequest
    from raygpu.model.reclaim import ReclaimPolicy

    snap = with_pending(with_idle_workers(synthetic_snapshot(50)), cycle_pgs(50))
    policy = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
    req = GangRequest(name="pg-0", cluster="rc", bundles=[{"GPU": 1.0}] * 4)
    return snap, reclaim_cluster(50), policy, gang_cluster(), req


def _collections_during(call, paused_only: bool = False) -> tuple[int, object]:
    """How many cyclic collections started while ``call()`` ran (``paused_only``: inside a pause), at threshold 1
    (one per tracked allocation)."""
    from raygpu.plan.common import collector

    started: list[int] = []
    cb = lambda phase, _info: started.append(1) if phase == "start" and (  # noqa: E731
        not paused_only or collector._depth > 0) else None
    old = gc.get_threshold()
    gc.callbacks.append(cb)
    gc.set_threshold(1)
    try:
        out = call()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    return len(started), out


@pytest.mark.parametrize("planner", ["plan_gang", "reconcile", "index_snapshot", "plan_reclaim", "plan_gc"])
def test_a_planner_never_pauses_the_collector_of_the_process_it_runs_in(planner):
    # plan_gang runs inside a user's Ray driver: switching off that process's collector is not a library's call
    from benchmarks.bench_decision_cost import NOW_S

    snap, rc, policy, gcl, req = _cycle_inputs()
    call = {"plan_gang": lambda: plan_gang(req, gcl), "reconcile": lambda: reconcile(snap, NOW_S),
            "index_snapshot": lambda: index_snapshot(snap), "plan_reclaim": lambda: plan_reclaim(snap, rc, policy, NOW_S),
            "plan_gc": lambda: plan_gc([], snap.ray, NOW_S, cluster=rc)}[planner]
    ran, _ = _collections_during(call)
    assert gc.isenabled()
    assert ran > 0  # the collector ran inside the planner: it was not paused


def test_no_collection_runs_inside_a_paused_cycle_even_at_threshold_one():
    from benchmarks.bench_decision_cost import NOW_S

    snap, rc, policy, _, _ = _cycle_inputs()

    def paused_plan():
        with collector_paused():
            return plan_reclaim(snap, rc, policy, NOW_S)
    inside, plan = _collections_during(paused_plan, paused_only=True)
    after, _ = _collections_during(lambda: [[] for _ in range(10)])
    assert plan.decisions  # it planned something (thousands of allocations)
    assert after > 0  # the probe sees collections once the pause ended
    assert inside == 0
