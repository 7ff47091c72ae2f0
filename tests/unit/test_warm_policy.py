"""The keep-warm policy (raygpu.plan.reclaim.warm), pure: recorded histories in, targets and their reasons out."""

from __future__ import annotations

import json

import pytest

from raygpu.model.views import ResourceDemand
from raygpu.model.warm import (GroupHistory, WarmHistory, WarmSettings, decode_history, encode_history)
from raygpu.plan.reclaim.warm import demand_by_group, plan_warm, record, rises_over
from raygpu.testing.builders.reclaim import NOW_S, world

S = WarmSettings(quantile=0.8, history_s=6 * 3600, fallback_timeout_s=300, min_samples=30, step_s=60)


def hist(demand: list[int], startup_s=(180.0,), t0: float = NOW_S - 3600, step_s: float = 60) -> GroupHistory:
    """One group's history: one demand sample per step from t0."""
    return GroupHistory(demand=tuple((t0 + i * step_s, n) for i, n in enumerate(demand)), startup_s=tuple(startup_s))


# ------------------------------------------------------------ rises
RISES = [
    # (case, demand per 60 s step, window s, rises)
    ("flat", [2, 2, 2, 2, 2], 120, [0, 0, 0]),
    ("a step up is seen by every sample within the window before it", [1, 1, 1, 4, 4], 120, [0, 3, 3]),
    ("a fall is no rise", [4, 3, 2, 1, 0], 120, [0, 0, 0]),
    ("a spike inside the window counts", [0, 5, 0, 0, 0], 120, [5, 0, 0]),
    ("the last window-length of samples has no full window yet", [0, 0], 180, []),
]


@pytest.mark.parametrize("case,demand,window_s,expected", RISES, ids=[r[0] for r in RISES])
def test_rise_over_the_start_up_window(case, demand, window_s, expected):
    samples = [(i * 60.0, n) for i, n in enumerate(demand)]
    assert rises_over(samples, window_s) == expected


def test_a_gap_gives_no_rise_for_the_samples_before_it():
    samples = [(0.0, 1), (60.0, 1), (3600.0, 9), (3660.0, 9), (3720.0, 9)]
    assert rises_over(samples, 120) == [0, 0]  # 0 sees 60 (no rise); 60 sees nothing in (60, 180]; 3600 is flat


# ------------------------------------------------------------ targets
def test_the_quantile_of_rises_is_the_target_and_the_reason_names_it():
    # 49 rises: 44 of 0, 5 of 2 (a burst of +2 every 10 samples) -> q0.8 = 0, q0.9 = 2 (nearest rank: the 45th)
    demand = [1] * 9 + [3]
    h = WarmHistory(groups={"gpu": hist(demand * 5, startup_s=(60.0,))})
    now = NOW_S - 3600 + 49 * 60
    t8 = plan_warm(h, ["gpu"], now, S)["gpu"]
    t9 = plan_warm(h, ["gpu"], now, S.model_copy(update={"quantile": 0.9}))["gpu"]
    assert (t8.warm, t9.warm) == (0, 2)
    assert t9.samples == 49 and t9.window_s == 60
    assert "q0.9" in t9.reason and "60s start-up" in t9.reason and "49 samples in the last 6h" in t9.reason
    assert "max 2" in t9.reason and "demand now 3" in t9.reason


def test_the_median_start_up_is_the_window():
    demand = ([0] * 7 + [4]) * 6  # a rise of 4 every 8 samples
    short = WarmHistory(groups={"gpu": hist(demand, startup_s=(60.0, 60.0, 600.0))})
    long = WarmHistory(groups={"gpu": hist(demand, startup_s=(180.0, 180.0, 30.0))})
    now = NOW_S
    assert plan_warm(short, ["gpu"], now, S)["gpu"].window_s == 60
    assert plan_warm(short, ["gpu"], now, S)["gpu"].warm == 0  # 1 in 8 samples sees the rise within 60 s
    assert plan_warm(long, ["gpu"], now, S)["gpu"].warm == 4  # 3 in 8 see it within 180 s: above 1 - q


def test_a_start_up_shorter_than_one_sample_step_still_learns():
    # pods that start in 20 s, demand sampled once a minute: the rise is measured over one step (the next
    # sample), not over no sample at all (which left the group on its fallback for ever)
    demand = [0, 0, 1] * 20  # a worker needed every third minute
    h = WarmHistory(groups={"gpu": hist(demand, startup_s=(20.0,))})
    t = plan_warm(h, ["gpu"], NOW_S - 3600 + 59 * 60, S)["gpu"]
    assert (t.warm, t.window_s, t.samples) == (1, 60, 59)
    assert "over one 60s sample step (start-up 20s, median of 1)" in t.reason


@pytest.mark.parametrize("case,history,why", [
    ("no start-up measured", hist([1] * 100, startup_s=()), "no pod start-up measured yet"),
    ("too few samples", hist([1] * 20), "< 30 needed"),
    ("unknown group", None, "no pod start-up measured yet"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_fallback_until_enough_history(case, history, why):
    h = WarmHistory(groups={"gpu": history} if history else {})
    t = plan_warm(h, ["gpu"], NOW_S, S)["gpu"]
    assert t.warm is None and t.fallback_timeout_s == 300
    assert why in t.reason and "fallback idle timeout 300s" in t.reason


def test_samples_older_than_the_horizon_do_not_count():
    old = [0, 5] * 30  # rises of 5, two hours before
    h = WarmHistory(groups={"gpu": hist(old + [1] * 40, t0=NOW_S - 100 * 60)})
    one_hour = S.model_copy(update={"history_s": 3600})
    assert plan_warm(h, ["gpu"], NOW_S, S)["gpu"].warm == 5
    assert plan_warm(h, ["gpu"], NOW_S, one_hour)["gpu"].warm == 0


# ------------------------------------------------------------ recording
def test_record_keeps_the_highest_demand_of_a_step_and_drops_the_horizon():
    s = S.model_copy(update={"history_s": 300})
    h = WarmHistory()
    for t, n in [(0, 1), (30, 3), (59, 2), (60, 0), (400, 7)]:
        h = record(h, t, {"gpu": n}, s, {"gpu": [100.0]} if t == 0 else None)
    assert h.groups["gpu"].demand == ((360.0, 7),)  # 0 and 60 are older than 400 - 300
    h2 = record(WarmHistory(), 0, {"gpu": 1}, s)
    h2 = record(h2, 30, {"gpu": 3}, s)
    assert h2.groups["gpu"].demand == ((0.0, 3),)
    assert h.groups["gpu"].startup_s == (100.0,)


def test_record_forgets_groups_no_longer_in_auto_and_what_a_clock_going_back_left_in_the_future():
    h = record(WarmHistory(), 600, {"gpu": 1, "cpu": 2}, S)
    h = record(h, 300, {"gpu": 9}, S)
    assert set(h.groups) == {"gpu"} and h.groups["gpu"].demand == ((300.0, 9),)


def test_start_ups_are_bounded():
    h = WarmHistory()
    for i in range(50):
        h = record(h, i * 60, {"gpu": 0}, S, {"gpu": [float(i)]})
    assert h.groups["gpu"].startup_s == tuple(float(i) for i in range(18, 50))


# ------------------------------------------------------------ demand
def test_demand_counts_busy_workers_pending_bundles_and_pending_tasks():
    snapshot, cluster = (world().group("gpu", gpus=8).group("cpu", gpus=0)
                         .worker("b1").worker("b2", free_gpus=4).worker("i1", idle_for_s=60)
                         .worker("c1", group="cpu", gpus=0)
                         .pg_pending([{"GPU": 4}] * 3)  # PACK, 12 GPUs -> 2 workers of 8
                         .pg_pending([{"GPU": 1}] * 3, strategy="STRICT_SPREAD")  # 3 workers
                         .pg([{"GPU": 8}, {"GPU": 8}], state="CREATED", on=["b1", "b2"])  # placed: no demand
                         .pg_pending([{"GPU": 64}])  # fits no group: left out
                         .obj())
    snapshot = snapshot.model_copy(update={"ray": snapshot.ray.model_copy(update={"resource_demand": (
        ResourceDemand(bundle={"GPU": 4}, count=3), ResourceDemand(bundle={"CPU": 1}, count=2))})})
    # gpu: 2 busy + ceil(12/8) = 2 + 3 (one per spread bundle) + the group's tasks together, ceil(3*4/8 + the
    # CPU tasks' small share) = 2; cpu: its busy c1
    d = demand_by_group(snapshot, cluster)
    assert d == {"gpu": 2 + 2 + 3 + 2, "cpu": 1}


def test_demand_of_an_idle_cluster_is_zero():
    snapshot, cluster = world().worker("i1", idle_for_s=60).worker("i2", idle_for_s=5).obj()
    assert demand_by_group(snapshot, cluster) == {"gpu": 0}


def test_a_pod_with_two_busy_ray_nodes_is_one_busy_worker():
    """Ray restarted inside pod b1 and its old node is still reported alive: one worker, not two."""
    snapshot, cluster = world().worker("b1").ray_node("b1", "n-b1-z").worker("i1", idle_for_s=60).obj()
    assert demand_by_group(snapshot, cluster) == {"gpu": 1}


# ------------------------------------------------------------ the ConfigMap form
def test_history_round_trips_and_stays_under_the_bound():
    big = WarmHistory(groups={g: hist(list(range(2000)), startup_s=(180.5,) * 32, t0=1.7e9) for g in ("a", "b")})
    text = encode_history(big, 16 * 1024)
    assert len(text.encode()) <= 16 * 1024
    back = decode_history(text)
    for g in ("a", "b"):
        kept = back.groups[g].demand
        assert 0 < len(kept) < 2000 and kept == big.groups[g].demand[-len(kept):]  # the oldest went
    small = WarmHistory(groups={"gpu": hist([1, 2, 3])})
    assert decode_history(encode_history(small)) == small


@pytest.mark.parametrize("text,why", [
    ("{", "not JSON"),
    (json.dumps({"version": 2, "groups": {}}), "expected"),
    (json.dumps({"version": 1, "groups": {"g": {"demand": [[1, 2]]}}}), "malformed"),
    (json.dumps({"version": 1, "groups": {"g": {"demand": [[1, [2]]], "startup_s": []}}}), "malformed"),
    (json.dumps({"version": 1, "groups": {"g": {"demand": [[5, 1], [1, 1]], "startup_s": []}}}), "time order"),
    (json.dumps({"version": 1, "groups": {"g": {"demand": [["x", 1]], "startup_s": []}}}), "could not convert"),
])
def test_a_malformed_history_is_a_value_error_saying_why(text, why):
    """Not the ConfigMap form at all; numbers out of bounds are ``load_history``'s (test_warm_state_bounds)."""
    with pytest.raises(ValueError, match=why):
        decode_history(text)


def test_ray_pending_task_demand_is_read_from_the_cluster_status():
    from raygpu.adapters.ray_gcs import demand_view

    recorded = [{"bundles_by_count": [{"bundle": {"GPU": 4.0, "CPU": 1}, "count": 3},
                                      {"bundle": {"CPU": 1}, "count": 0}]}]  # as dataclasses.asdict gives them
    assert demand_view(recorded) == (ResourceDemand(bundle={"GPU": 4.0, "CPU": 1.0}, count=3),)
    assert demand_view([]) == ()
