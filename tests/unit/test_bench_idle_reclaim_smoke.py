"""bench_idle_reclaim: the quick run is well formed, and the simulation can tell the two policies apart.

The smoke test runs ``--quick --json --no-plot`` in a subprocess (never a speed
check). The scenario tests drive the benchmark's ``Sim`` on hand-made states
where a pending placement group meets idle workers: on the real trace that never
happens (``contested`` = 0), so without them an "identical" result could also
mean a broken ``SchedulingRequest`` or snapshot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._common import OPENB, TRACES  # the benchmarks' own trace lookup

ROOT = Path(__file__).resolve().parents[2]
TRACE = TRACES / "alibaba-genai-v2026" / "pod_gpu_duty_cycle_anon.tar.gz"


def test_idle_reclaim_quick() -> None:
    if not TRACE.exists():
        pytest.skip(f"alibaba-genai-v2026 trace not found at {TRACE}")
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_idle_reclaim", "--quick", "--json", "--no-plot"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["benchmark"] == "idle_reclaim"
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["python"]
    assert result["params"]["quick"] is True
    # every trace it can replay, each in the same form; the one it cannot is named with the reason
    assert [t["trace"] for t in result["traces"]] == (["genai", "openb"] if OPENB.exists() else ["genai"])
    assert "alibaba-spot-v2026" in result["not_replayed"]
    for tr in result["traces"]:
        _check_trace(tr, result["params"])


def _check_trace(tr: dict, shared: dict) -> None:
    params, rows = {**shared, **tr["params"]}, tr["rows"]
    assert params["steps"] > 0 and params["streams"] > 0
    assert params["step_s"] <= 10.0  # the simulation step is finer than any figure it reports
    n_fixed = sum(1 for r in rows if r["policy"] == "ray-v2")
    assert n_fixed >= len(params["idle_timeouts_s"])
    warm = ["auto-warm"] if tr["trace"] == "openb" else []  # openb has hours before its window; genai has none
    assert [r["policy"] for r in rows] == ["ray-v2"] * n_fixed + ["auto", *warm, "oracle"]  # side by side
    fixed = rows[:n_fixed]
    # every fixed row is a real run (the sweep or a bisection probe), never an interpolation
    assert sorted(r["idle_timeout_s"] for r in fixed) == sorted(params["idle_timeouts_s"] + params["probed_timeouts_s"])
    assert len({r["idle_timeout_s"] for r in fixed}) == n_fixed
    ray0 = rows[0]
    for r in rows:
        # every policy saw the same demand: the same trace streams and the same PG arrivals
        for key in ("streams", "steps", "demand_gpu_h", "pgs", "initial_pods"):
            assert r[key] == ray0[key], key
        assert r["decision_calls"] + r["decision_skipped"] == params["steps"] * params["clusters"]
        assert r["decision_calls"] > 0
    assert ray0["demand_gpu_h"] > 0 and ray0["pgs"] > 0
    for ray in fixed:  # the shadow comparison ran and is self-consistent
        assert ray["shadow_disagree_steps"] >= 0
        assert (ray["shadow_disagree_steps"] == 0) == (ray["shadow_only_ray"] == ray["shadow_only_raygpu"] == 0)
    auto, oracle = rows[n_fixed], rows[-1]
    assert auto["warm_steps"] > 0 and oracle["warm_steps"] == params["steps"] * params["clusters"]
    assert auto["first_warm_s"] > 0  # cold: the fallback until it has learned
    if warm:
        assert rows[n_fixed + 1]["first_warm_s"] == 0  # warm: a target from the first step
    goal = tr["goal"][0]
    assert goal["lines"]
    for pol in ("auto", *warm):
        g = goal[pol]
        assert ("met" in g) == g["in_range"]
        if not g["in_range"]:
            continue
        # compared with a real row, the nearest one not above its idle GPU-h
        row = next(r for r in rows if r["policy"] == pol)
        ref = next(r for r in fixed if r["idle_timeout_s"] == g["fixed_timeout_s"])
        assert ref["idle_gpu_h"] <= row["idle_gpu_h"]
        assert not any(ref["idle_gpu_h"] < r["idle_gpu_h"] <= row["idle_gpu_h"] for r in fixed)
        assert g["ratios"]["launches"] == round(row["launches"] / ref["launches"], 3)
        assert g["ratios"]["pg_wait_p95_s"] == round(row["pg_wait_p95_s"] / ref["pg_wait_p95_s"], 3)
        # the cold-start match is against the same row, and its end is the whole run's ratio
        cold = next(c for c in tr["cold"] if c["policy"] == pol)
        assert cold["fixed_timeout_s"] == ref["idle_timeout_s"] and cold["ratios"] == g["ratios"]
        assert abs(cold["launches_at_end"] - row["launches"] / ref["launches"]) <= 0.002
        assert cold["match_h"] is None or 0 <= cold["match_h"] <= params["hours"]
    # the PG-wait frontier: one foresight run per look-ahead, on the same PGs; where auto's p95 goal is not
    # met, the goal says whether knowing when every PG comes could meet it within the fixed row's idle
    pg_front = goal["pg_frontier"]
    assert [f["horizon_s"] for f in pg_front] == params["pg_frontier_s"] and pg_front
    for f in pg_front:
        assert f["pgs"] == ray0["pgs"] and 0 <= f["pg_waited_over_half_startup"] <= f["pgs"]
        assert f["pg_wait_p95_s"] >= f["pg_wait_p50_s"] >= 0
    assert pg_front[-1]["idle_gpu_h"] > pg_front[0]["idle_gpu_h"]  # looking further ahead keeps more warm
    for pol in ("auto", *warm):
        g = goal[pol]
        if g["in_range"] and not g["p95_met"]:
            within = [f for f in pg_front if f["idle_gpu_h"] <= g["fixed_idle_gpu_h"]]
            target = 0.5 * g["fixed"]["pg_wait_p95_s"]
            assert g["p95_reachable_by_foresight"] == (any(f["pg_wait_p95_s"] <= target for f in within)
                                                      if within else None)
            assert any(line.startswith(f"  {pol}'s PG wait p95 goal") for line in goal["lines"])
    bound = tr["bound"][0]
    front = bound["frontier"]
    assert front[0] == [0.0, bound["launches_at_zero_idle"]]
    assert all(a[0] <= b[0] and a[1] > b[1] for a, b in zip(front, front[1:]))  # more idle, fewer launches
    assert [b["policy"] for b in bound["rows"]] == [r["policy"] for r in rows]
    for b, r in zip(bound["rows"], rows):
        assert b["bound_launches_at_idle"] <= bound["launches_at_zero_idle"]
        if r["waiting_gpu_h"] == 0:  # the bound is for zero waiting: such a row cannot beat it
            assert r["launches"] >= b["bound_launches_at_idle"]
    for r in rows:
        for key in ("idle_gpu_h", "waiting_gpu_h", "task_gpu_h", "bundle_gpu_h", "pg_wait_p50_s"):
            assert r[key] >= 0, key
        assert r["idle_gpu_h"] + r["task_gpu_h"] + r["bundle_gpu_h"] <= r["alive_gpu_h"] + 0.05
        assert r["alive_gpu_h"] <= r["provisioned_gpu_h"] + 0.05
        # every busy stream either runs or waits
        assert abs(r["task_gpu_h"] + r["waiting_gpu_h"] - r["demand_gpu_h"]) <= 0.05
        assert r["pg_wait_p95_s"] >= r["pg_wait_p50_s"]
        assert 0 <= r["pg_delayed"] <= r["pgs"] and 0 <= r["pgs_unplaced"] <= r["pgs"]
        assert 0 <= r["churn"] <= r["scale_downs"] <= r["initial_pods"] + r["launches"]
        assert r["scale_downs"] > 0  # the trace's idle periods were reclaimed by both
        # both remove idle workers only: no PG or running work is ever broken
        assert r["pg_broken"] == 0 and r["work_killed"] == 0
        assert r["other_terminations"] == 0
        assert 0 <= r["contested_steps"] <= r["pending_pg_steps"]
    assert auto["raygpu_holds_bundle"] > 0  # plan_reclaim saw the bundles


def test_cold_match_definition() -> None:
    """matched from = the first step after which launches stay <= the fixed run's and idle within the slack."""
    from benchmarks._idle_reclaim_pareto import cold_match

    def series(launches: list[int], idle_s: list[float]) -> list[tuple[float, ...]]:
        return [(i * 1800.0, 0, 0, 0, 0, 0, n, x) for i, (n, x) in enumerate(zip(launches, idle_s))]

    fixed = series([2, 4, 6, 8, 10], [100, 200, 300, 400, 500])
    # launches above the fixed run's at first, then at or below it from the third step (1 h) on
    auto = series([3, 5, 6, 7, 8], [150, 210, 300, 400, 505])
    c = cold_match(auto, fixed, 0.02)
    assert c["match_h"] == 1.0 and c["launches_at_end"] == 0.8 and c["idle_at_end"] == 1.01
    assert c["launches_at_1h"] == 1.0
    # idle over the slack at the second step: launches alone do not match
    auto = series([1, 2, 3, 4, 5], [100, 300, 300, 400, 500])
    assert cold_match(auto, fixed, 0.02)["match_h"] == 1.0
    # never at or below at the end: no match
    assert cold_match(series([1, 2, 3, 4, 11], [0] * 5), fixed, 0.02)["match_h"] is None


# ------------------------------------------------------- hand-made scenarios
def _bench():
    # its Sim calls ray.autoscaler.v2: ray is a [test] dependency, so without it these fail (never skip)
    from benchmarks import bench_idle_reclaim

    return bench_idle_reclaim


def _run(b, policy: str, streams: list[list[int]], pg, cap: int, steps: int = 30):
    p = b.Params(gpus_per_pod=4.0, idle_timeout_s=60.0, startup_s=180.0, min_replicas=0, max_replicas=cap,
                 step_s=57.0)
    sim = b.Sim(0, policy, streams, [pg], p)
    for i in range(steps):
        sim.step(i)
    return sim


def _pg(b, bundles: tuple[float, ...]):
    return b.PG(pg_id="0" * 36, name="pg", bundles=bundles, strategy="STRICT_SPREAD", arrive_s=100.0,
                life_s=3600.0)


def test_feasible_spread_pg_keeps_idle_workers_in_both() -> None:
    """Two idle workers, a pending STRICT_SPREAD PG of 3 x {"GPU": 1}: both policies keep them for it.

    Ray's scheduler must see the anti-affinity (else it packs all 3 bundles on the 2
    idle nodes, launches nothing and the PG never places).
    """
    b = _bench()
    streams = [[1] + [0] * 29, [1] + [0] * 29]
    pgs = {}
    for policy in ("ray-v2", "raygpu"):
        pg = _pg(b, (1.0, 1.0, 1.0))
        sim = _run(b, policy, streams, pg, cap=10)
        pgs[policy] = pg
        assert sim.m["contested_steps"] > 0  # the protection was needed
        assert sim.m["launches"] == 1 and sim.m["pg_delayed"] == 0 and sim.m["pg_broken"] == 0
        assert pg.placed_s is not None and len(set(pg.nodes)) == 3  # spread over 3 workers
        if policy == "ray-v2":
            assert sim.m["shadow_disagree_steps"] == 0
        else:
            assert sim.raygpu_reasons["NeededByPendingPG"] > 0
    assert pgs["ray-v2"].placed_s == pgs["raygpu"].placed_s


def test_infeasible_gang_at_cap_differs() -> None:
    """At maxReplicas, a PG that needs one more worker than is free: Ray's gang request is infeasible.

    Ray (as of 2.60) then protects nothing and removes the two idle workers; raygpu keeps the ones
    the PG's bundles fit on, so the PG places as soon as the busy worker frees, with no start-up wait.
    """
    b = _bench()
    streams = [[1] + [0] * 29, [1] + [0] * 29, [1] * 10 + [0] * 20]
    out = {}
    for policy in ("ray-v2", "raygpu"):
        pg = _pg(b, (4.0, 4.0, 4.0))
        out[policy] = (_run(b, policy, streams, pg, cap=3), pg)
    ray, ray_pg = out["ray-v2"]
    ours, our_pg = out["raygpu"]
    assert ray.m["shadow_disagree_steps"] > 0 and ray.m["shadow_only_ray"] >= 2
    assert ray.m["pg_delayed"] == 1 and ours.m["pg_delayed"] == 0
    assert ours.raygpu_reasons["NeededByPendingPG"] > 0
    assert our_pg.placed_s == 10 * 57.0  # the step the third worker frees
    assert ray_pg.placed_s is not None and ray_pg.placed_s > our_pg.placed_s  # waited for new pods
    assert ours.m["idle_gpu_s"] > ray.m["idle_gpu_s"]  # the price: idle workers held for the PG


# ------------------------------------------------------- the perfect-foresight bound
def test_bound_levels_and_budget() -> None:
    """Levels of a hand-made demand curve: the gaps, and the fewest launches for an idle budget."""
    from benchmarks._idle_reclaim_bound import bound, level_gaps

    # worker 2 needed at step 1 and again at 4 (gap 2 steps); worker 1 falls at 6 and is needed at 10 (gap 4)
    demand = [1, 2, 1, 1, 2, 1, 0, 0, 0, 0, 1]
    launches, gaps = level_gaps(demand)
    assert launches == 3 and sorted(gaps) == [2, 4]
    b = bound([demand], step_s=900.0, gpus_per_pod=4.0)  # one step = 1 GPU-h per worker of 4 GPUs
    assert b.launches0 == 3 and b.gap_gpu_h == (2.0, 4.0)
    assert [b.min_launches(x) for x in (0.0, 1.9, 2.0, 5.9, 6.0, 99.0)] == [3, 3, 2, 2, 1, 1]
    assert [b.min_idle(n) for n in (3, 2, 1, 0)] == [0.0, 2.0, 6.0, None]  # the first rise to 2 needs a launch whatever the budget


def test_bound_floor_counts_pg_workers() -> None:
    """A PACK PG of 3 x 2 GPUs needs 2 pods of 4 GPUs at least; a STRICT_SPREAD one of 3 x 1 needs 3."""
    from benchmarks._idle_reclaim_bound import demand_floor

    b = _bench()
    pack = b.PG(pg_id="1" * 36, name="p", bundles=(2.0, 2.0, 2.0), strategy="PACK", arrive_s=0.0, life_s=20.0)
    spread = b.PG(pg_id="2" * 36, name="s", bundles=(1.0, 1.0, 1.0), strategy="STRICT_SPREAD", arrive_s=30.0,
                  life_s=20.0)
    assert demand_floor([[1, 1, 0, 0, 0, 0]], [pack, spread], 6, 10.0, 4.0) == [3, 3, 0, 3, 3, 0]
