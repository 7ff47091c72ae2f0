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

from benchmarks._common import TRACES  # the benchmarks' own trace lookup

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
    params, rows = result["params"], result["rows"]
    assert params["quick"] is True and params["steps"] > 0 and params["streams"] > 0
    n_fixed = len(params["idle_timeouts_s"])
    assert [r["policy"] for r in rows] == ["ray-v2"] * n_fixed + ["auto", "oracle"]  # one curve, side by side
    ray0 = rows[0]
    for r in rows:
        # every policy saw the same demand: the same trace streams and the same PG arrivals
        for key in ("streams", "steps", "demand_gpu_h", "pgs", "initial_pods"):
            assert r[key] == ray0[key], key
        assert r["decision_calls"] == params["steps"] * params["clusters"]
    assert ray0["demand_gpu_h"] > 0 and ray0["pgs"] > 0
    for ray in rows[:n_fixed]:  # the shadow comparison ran and is self-consistent
        assert ray["shadow_disagree_steps"] >= 0
        assert (ray["shadow_disagree_steps"] == 0) == (ray["shadow_only_ray"] == ray["shadow_only_raygpu"] == 0)
    auto, oracle = rows[n_fixed:]
    assert auto["warm_steps"] > 0 and oracle["warm_steps"] == params["steps"] * params["clusters"]
    goal = result["goal"][0]
    assert goal["lines"] and ("auto" in goal) and ("p95_met" in goal["auto"]) == goal["auto"]["in_range"]
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
