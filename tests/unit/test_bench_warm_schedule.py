"""The keep-warm testbed benchmark's pure parts: the seeded schedule, the prior history, the per-arm numbers."""

from __future__ import annotations

from benchmarks._warm_schedule import prior_demand, schedule, summarize
from raygpu.model.warm import WarmSettings
from raygpu.plan.reclaim.warm import plan_warm
from raygpu.model.warm import GroupHistory, WarmHistory


def test_the_schedule_is_seeded_bounded_and_ends_inside_the_run():
    a, b = schedule(12, 20, 180), schedule(12, 20, 180)
    assert a == b and a != schedule(13, 20, 180)
    assert all(1 <= len(x.holds_s) <= 3 for x in a) and all(36 <= h <= 90 for x in a for h in x.holds_s)
    assert a[0].at_s == 9 and all(x.at_s <= 20 * 60 - 180 for x in a)
    assert [x.at_s for x in a] == sorted(x.at_s for x in a) and 6 <= len(a) <= 7


def test_a_prior_of_the_schedule_gives_auto_a_target_once_a_start_up_is_measured():
    end = 1_700_000_000.0
    demand = prior_demand(1, 2, 180, end)
    assert len(demand) >= 110 and all(t < end - 60 for t, _ in demand) and max(n for _, n in demand) <= 3
    assert any(n == 0 for _, n in demand) and any(n > 0 for _, n in demand)
    h = WarmHistory(groups={"gpu": GroupHistory(demand=demand, startup_s=(15.0,))})
    t = plan_warm(h, ["gpu"], end, WarmSettings())["gpu"]
    assert t.warm is not None and 1 <= t.warm <= 3, t.reason


def test_summary_counts_launches_waits_and_idle_pod_seconds():
    pods = {"old": (50.0, None), "a": (100.0, 160.0), "b": (120.0, None)}  # "old" was there before t0
    pgs = [{"created": 100.0, "ready": 110.0, "removed": 140.0}, {"created": 120.0, "ready": 150.0, "removed": None},
           {"created": 190.0, "ready": None, "removed": 199.0}]
    s = summarize(pods, pgs, 100.0, 200.0)
    assert (s["pod_launches"], s["pgs"], s["pgs_ready"]) == (2, 3, 2)
    assert (s["wait_max_s"], s["waits_over_10s"]) == (30.0, 1)
    assert s["worker_pod_s"] == 100 + 60 + 80 and s["held_s"] == 30 + 50 and s["idle_worker_s"] == 240 - 80
