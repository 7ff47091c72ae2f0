"""Keep-warm state is read defensively, and the warm planner's work is linear in samples.

A history comes from a ConfigMap anyone with access can edit, and from a clock that can step: a sample
dated in the future, a demand of 10^18, a start-up of a century or a state past the size cap must each
cost at most themselves (dropped or cut, with a repair the sidecar reports), never the whole policy.
Work is counted in executed Python lines (``benchmarks._decision_reference.executed_lines``), not timed.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks._decision_reference import executed_lines
from raygpu.model.warm import (MAX_DEMAND_WORKERS, MAX_STARTUP_S, MAX_STATE_BYTES, GroupHistory, WarmHistory,
                               WarmSettings, encode_history, load_history)
from raygpu.plan.reclaim.warm import plan_warm, record, rises_over

S = WarmSettings(quantile=0.8, history_s=6 * 3600, fallback_timeout_s=300, min_samples=30, step_s=60)
NOW_S = 1_700_000_000.0


def state(demand, startup_s=(180.0,), group="gpu") -> str:
    """The ConfigMap text of one group, whatever its size (no cap)."""
    return json.dumps({"version": 1, "groups": {group: {"demand": [list(x) for x in demand],
                                                        "startup_s": list(startup_s)}}})


def steady(n: int, value: int = 0, t0: float = NOW_S - 3 * 3600) -> list[tuple[float, int]]:
    return [(t0 + 60 * i, value) for i in range(n)]


# ------------------------------------------------------------------ a sample dated in the future
def test_after_a_future_dated_sample_record_still_takes_new_samples():
    """A clock stepped forward then back (or an edit) left a sample in the future: it goes, the new one stays."""
    h = WarmHistory(groups={"gpu": GroupHistory(demand=((NOW_S - 120, 1), (NOW_S + 10 * 86400, 5)))})
    out = record(h, NOW_S, {"gpu": 3}, S).groups["gpu"].demand
    assert out == ((NOW_S - 120, 1), (math.floor(NOW_S / 60) * 60, 3))


def test_the_planner_ignores_samples_past_now():
    future = [(NOW_S + 60 * (i + 1), 50 * (i % 2)) for i in range(100)]  # rises of 50 if they counted
    h = WarmHistory(groups={"gpu": GroupHistory(demand=tuple(steady(100) + future), startup_s=(180.0,))})
    assert plan_warm(h, ["gpu"], NOW_S, S)["gpu"].warm == 0


def test_future_samples_in_the_state_are_dropped_with_a_repair():
    history, repairs = load_history(state(steady(100, 2) + [(NOW_S + 86400, 7)]), NOW_S)
    assert history.groups["gpu"].demand == tuple(steady(100, 2))
    assert [r.reason for r in repairs] == ["WarmStateFutureSamples"]
    assert "1 demand sample" in repairs[0].message and "gpu" in repairs[0].message


# ------------------------------------------------------------------ bounds on every number
@pytest.mark.parametrize("demand,startup,kept_demand,kept_startup", [
    ([(NOW_S - 120, 10**18), (NOW_S - 60, 1)], [180.0], [(NOW_S - 60, 1)], [180.0]),
    ([(NOW_S - 120, MAX_DEMAND_WORKERS), (NOW_S - 60, -1)], [180.0], [(NOW_S - 120, MAX_DEMAND_WORKERS)], [180.0]),
    ([(NOW_S - 60, 1)], [180.0, 1e12, -5.0, MAX_STARTUP_S], [(NOW_S - 60, 1)], [180.0, MAX_STARTUP_S]),
    ([(-1e300, 1), (NOW_S - 60, 1)], [180.0], [(NOW_S - 60, 1)], [180.0]),
])
def test_numbers_out_of_bounds_are_dropped_sample_by_sample(demand, startup, kept_demand, kept_startup):
    history, repairs = load_history(state(demand, startup), NOW_S)
    assert history.groups["gpu"].demand == tuple(kept_demand)
    assert history.groups["gpu"].startup_s == tuple(kept_startup)
    assert [r.reason for r in repairs] == ["WarmStateOutOfBounds"]


def test_non_finite_numbers_are_out_of_bounds_not_a_crash():
    text = '{"version": 1, "groups": {"gpu": {"demand": [[1700000000, 1]], "startup_s": [NaN, Infinity, 180]}}}'
    history, repairs = load_history(text, NOW_S)
    assert history.groups["gpu"].startup_s == (180.0,) and [r.reason for r in repairs] == ["WarmStateOutOfBounds"]


def test_a_demand_of_ten_to_the_eighteen_no_longer_keeps_every_idle_worker():
    """Half the samples at 10^18: accepted whole, q0.8 of the rises was 10^18 warm workers."""
    demand = [(NOW_S - 7200 + 60 * i, 10**18 if i % 2 else 0) for i in range(110)]
    history, _ = load_history(state(demand), NOW_S)
    assert plan_warm(history, ["gpu"], NOW_S, S)["gpu"].warm == 0


def test_record_caps_a_measured_demand_and_drops_an_impossible_start_up():
    out = record(WarmHistory(), NOW_S, {"gpu": 10**18}, S, {"gpu": [180.0, 1e12]}).groups["gpu"]
    assert out.demand[-1][1] == MAX_DEMAND_WORKERS and out.startup_s == (180.0,)


def test_a_clean_state_loads_with_no_repair():
    demand = steady(150, 3)
    history, repairs = load_history(encode_history(WarmHistory(groups={"gpu": GroupHistory(
        demand=tuple(demand), startup_s=(180.0,))})), NOW_S)
    assert repairs == () and history.groups["gpu"].demand == tuple(demand)


# ------------------------------------------------------------------ the size cap, on read too
def test_an_oversized_state_is_cut_to_its_newest_part():
    demand = [(NOW_S - 21000 + 0.5 * i, i % 7) for i in range(40_000)]  # about 600 KiB of JSON
    text = state(demand)
    assert len(text) > 5 * MAX_STATE_BYTES
    history, repairs = load_history(text, NOW_S)
    kept = history.groups["gpu"].demand
    assert 0 < len(kept) < 40_000 and kept == tuple(demand[-len(kept):])  # the newest part
    assert len(encode_history(history, 10**9).encode()) <= MAX_STATE_BYTES
    assert [r.reason for r in repairs] == ["WarmStateTooLarge"]
    assert f"{len(text.encode())} bytes" in repairs[0].message


# ------------------------------------------------------------------ linear in samples
SIZES = (2_000, 4_000, 8_000)
MAX_RATIO = 2.1  # doubling the samples may at most double the lines, and a little more


def _dense(n: int) -> WarmHistory:
    """n samples evenly over the 6 h horizon: the denser, the more samples each 180 s window holds."""
    span = S.history_s - 600
    return WarmHistory(groups={"gpu": GroupHistory(
        demand=tuple((NOW_S - span + span * i / n, (i * 7919) % 13) for i in range(n)), startup_s=(180.0,))})


def _ratios(counts: list[int]) -> list[float]:
    return [b / a for a, b in zip(counts, counts[1:])]


def test_plan_warm_executes_lines_linear_in_samples():
    counts = [executed_lines(lambda h=_dense(n): plan_warm(h, ["gpu"], NOW_S, S)) for n in SIZES]
    assert counts[0] > SIZES[0]  # it counted the planner's work (a few lines per sample)
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (SIZES, counts)


def test_load_history_executes_lines_linear_in_samples():
    """Every size over the cap (a state under it is only parsed and bounded, less work per sample)."""
    sizes = (8_000, 16_000, 32_000)
    texts = [encode_history(_dense(n), 10**9) for n in sizes]
    assert len(texts[0]) > MAX_STATE_BYTES
    counts = [executed_lines(lambda t=t: load_history(t, NOW_S)) for t in texts]
    assert all(r <= MAX_RATIO for r in _ratios(counts)), (sizes, counts)


@pytest.mark.parametrize("seed", range(20))
def test_rises_over_is_the_definition(seed):
    """The sliding-window rise equals its definition: max d(t') - d(t) over t < t' <= t + W, 0 when it falls,
    for each sample whose window the history covers and that has a later sample in it."""
    import random

    r = random.Random(seed)
    t, demand = 0.0, []
    for _ in range(r.randint(0, 60)):
        t += r.choice((1, 5, 60, 60, 200))
        demand.append((t, r.randint(0, 9)))
    window = r.choice((30.0, 60.0, 180.0, 600.0))
    want = []
    for i, (ti, d) in enumerate(demand):
        if ti + window > demand[-1][0]:
            break
        later = [n for tj, n in demand[i + 1:] if tj <= ti + window]
        if later:
            want.append(max(0, max(later) - d))
    assert rises_over(demand, window) == want
