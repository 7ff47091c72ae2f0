"""Each benchmark (``python -m benchmarks.bench_<name>``) runs with ``--quick --json`` and prints well-formed output (never a speed check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._common import TRACES  # the benchmarks' own trace lookup

ROOT = Path(__file__).resolve().parents[2]
OPENB = TRACES / "alibaba-gpu-v2023"


def run(module: str, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--quick", "--json", *extra],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def check_machine(result: dict) -> None:
    assert result["machine"]["cpu_count"] >= 1
    assert result["machine"]["python"]


def test_gang_admission_quick() -> None:
    if not (OPENB / "openb_node_list_gpu_node.csv").exists():
        pytest.skip(f"openb trace not found under {OPENB}")
    result = run("bench_gang_admission", "--no-plot")
    check_machine(result)
    assert result["benchmark"] == "gang_admission"
    assert result["cluster"]["nodes"] > 0 and result["cluster"]["gpus"] > 0
    rows = result["rows"]
    shares = result["params"]["gang_shares"]
    policies = ["pods", "raycluster-gang", "raygpu", "raygpu+guard", "scale-up", "easy-backfill", "volcano-reserve",
                "kueue-strictfifo"]
    assert len(rows) == len(policies) * len(shares)
    assert [r["policy"] for r in rows] == policies * len(shares)
    for r in rows:
        assert r["jobs"] == result["params"]["jobs"] > 0
        assert r["gangs"] > 0
        for key in ("partial_gpu_h", "deadlock_h", "gang_wait_p50_s", "gang_wait_p95_s", "makespan_h"):
            assert r[key] >= 0, key
        assert r["gang_wait_p99_s"] >= r["gang_wait_p95_s"] >= r["gang_wait_p50_s"]
        assert r["hold_timeouts"] >= 0 and r["packing"] == "first-fit"
        assert 0 < r["mean_running_gpu_frac"] <= 1
        assert r["makespan_h"] > 0
        assert isinstance(r["deadlocks"], int) and r["deadlocks"] >= 0
    raygpu = [r for r in rows if r["policy"] in ("raygpu", "raygpu+guard", "scale-up", "easy-backfill",
                                                  "volcano-reserve", "kueue-strictfifo")]
    assert all(r["partial_gpu_h"] == 0 and r["deadlocks"] == 0 for r in raygpu)  # all-or-nothing holds nothing
    assert all(r["plan_gang_calls"] == r["gangs"] for r in raygpu if r["policy"] in ("raygpu", "raygpu+guard"))
    scale_up = [r for r in rows if r["policy"] == "scale-up"]  # one plan per reservation, retries included
    assert all(r["plan_gang_calls"] == r["reservations"] >= r["gangs"] and r["unfinished"] == 0 for r in scale_up)
    assert all(r["max_in_flight"] <= result["params"]["scale_up"]["in_flight"] == 4 for r in scale_up)
    assert all(r["reaction_p50_s"] >= 10 and r["raygpu_p95_s"] > 0 for r in scale_up)  # grace + cycle at least
    guard = [r for r in rows if r["policy"] == "raygpu+guard"]
    assert all(r["held_idle_gpu_h"] >= 0 and r["reservations"] >= r["started_by_reservation"] for r in guard)
    assert result["params"]["backfill"] == "all" and result["clusters"]["quick"]["pools"] == 1  # quick: one scope
    assert all(r["pools"] == 1 and r["max_reservations_at_once"] <= 1 for r in guard)
    assert all(r["max_blocked_s"] <= result["params"]["max_hold_s"] + 1 for r in guard)  # max-hold bounds it in all
    assert all(g["best_reserving"] in ("easy-backfill", "volcano-reserve", "kueue-strictfifo") for g in result["goal"])
    assert [(g["size"], g["seed"]) for g in result["goal"]] == [("quick", result["params"]["seeds"][0])] * len(shares)


def test_decision_cost_quick() -> None:
    result = run("bench_decision_cost", "--runs", "1", "--no-plot")
    check_machine(result)
    assert result["benchmark"] == "decision_cost"
    assert result["plots"] == []  # --no-plot
    rows = result["rows"]
    assert [r["nodes"] for r in rows] == [50, 100]
    for r in rows:
        for key in ("index_ms", "reconcile_ms", "reclaim_ms", "gang_ms", "raygpu_total_ms", "raygpu_total_wall_ms",
                    "gc_on_total_ms"):
            assert r[key] > 0, key
        assert r["reclaim_deletes"] > 0  # the idle workers were found
        assert r["reference_ms"] > 0 and r["total_over_reference"] > 1  # the cycle does more than read the data
        assert r["lines"] > 100 * r["nodes"] and r["lines_per_node"] == round(r["lines"] / r["nodes"], 1)
    assert set(result["fits"]) == {"index", "reconcile", "reclaim", "gang", "raygpu_total", "gc_on_total", "reference",
                                   "backlog-2x4_cycle", "backlog-2x4_lines", "backlog-4x8_cycle", "backlog-4x8_lines",
                                   "plan_gc"}
    # the worst pending shapes: twice the idle room pending, planned within the search budget
    assert [(b["nodes"], b["shape"]) for b in result["backlog"]] == [
        (n, s) for n in (50, 100) for s in ("backlog-2x4", "backlog-4x8")]
    for b in result["backlog"]:
        assert b["pending_pgs"] > 0 and b["cycle_ms"] > b["reclaim_ms"] > 0 and b["search_budget_spent"] == ""
        assert b["lines_per_node"] == round(b["lines"] / b["nodes"], 1)
    two = [b for b in result["backlog"] if b["shape"] == "backlog-2x4"]
    assert all(b["kept_for_pgs"] > 0 for b in two)  # half the backlog fits on the idle workers: they stay
    assert [g["reservations"] for g in result["gc"]] == [100, 200]
    assert all(g["gc_ms"] > 0 and g["to_release"] == 2 * g["reservations"] // 3 for g in result["gc"])
    assert result["lines_fit"]["loglog_exponent"] <= 1.05  # linear work, counted
    assert result["lines_fit"]["thousand_lines_per_1000_nodes"] > 100  # a count, named as one (not "ms")
    assert [(c["nodes"], c["state"]) for c in result["comparison"]] == [
        (n, s) for n in (50, 100) for s in ("none", "scale-up", "worst")]
    for c in result["comparison"]:
        assert c["raygpu_ms"] > 0 and c["raygpu_deletes"] > 0
        # Ray's scheduler either ran (a positive time) or says why it did not
        assert (c["ray_ms"] is not None and c["ray_ms"] > 0 and c["ray_over_raygpu"] > 0) or c["ray_note"]
        if c["ray_ms"] is not None and c["state"] == "scale-up":
            assert c["ray_to_launch"] > 0  # the demand fits no idle node: Ray launches
    # part 5: raygpu's worst beside Ray's at each size, and the cost of both running (in-tree autoscaler on)
    assert [w["nodes"] for w in result["worst"]] == [50, 100]
    for w in result["worst"]:
        assert w["gc_reservations"] == w["nodes"] and w["gc_ms"] > 0
        assert w["reclaim_worst_ms"] >= max(c["raygpu_ms"] for c in result["comparison"] if c["nodes"] == w["nodes"])
        assert w["raygpu_worst_ms"] == round(w["sidecar_worst_ms"] + w["gc_ms"], 2)
        assert w["both_worst_ms"] is None or w["both_worst_ms"] > w["raygpu_worst_ms"]
