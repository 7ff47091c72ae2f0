"""The cyclic garbage collector is paused while a pure planner runs, and restored after (plan/collector.py)."""

from __future__ import annotations

import gc
import threading

import pytest

from raygpu.plan.collector import collector_paused, pauses_collector
from raygpu.plan.cycle import plan_cycle
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.gang import plan_gang
from raygpu.plan.gc import plan_gc
from raygpu.plan.index import index_snapshot
from raygpu.plan.reclaim import plan_reclaim


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


@pytest.mark.parametrize("planner", [plan_cycle, reconcile, plan_gang, plan_gc, index_snapshot, plan_reclaim])
def test_the_planners_are_wrapped_in_the_pause(planner):
    # the function the module exports is pauses_collector's wrapper around the planner
    assert planner.__code__ is pauses_collector(lambda: None).__code__
    assert planner.__wrapped__.__name__ == planner.__name__


def test_no_collection_runs_inside_a_planner_even_at_threshold_one():
    from benchmarks.bench_decision_cost import (NOW_S, cycle_pgs, reclaim_cluster, synthetic_snapshot,
                                                with_idle_workers, with_pending)
    from raygpu.model.reclaim import ReclaimPolicy
    from raygpu.plan import collector

    snap = with_pending(with_idle_workers(synthetic_snapshot(50)), cycle_pgs(50))
    rc, policy = reclaim_cluster(50), ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
    depth_at_collection: list[int] = []
    cb = lambda phase, _info: depth_at_collection.append(collector._depth) if phase == "start" else None  # noqa: E731
    old = gc.get_threshold()
    gc.callbacks.append(cb)
    gc.set_threshold(1)  # a collection at every allocation of a tracked object, unless paused
    try:
        plan = plan_reclaim(snap, rc, policy, NOW_S)
        _ = [[] for _ in range(10)]  # after the planner the collector runs again
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    assert plan.decisions  # it planned something (thousands of allocations)
    assert depth_at_collection  # collections ran around it: the probe sees them
    assert all(d == 0 for d in depth_at_collection)  # none while the planner's pause was on
