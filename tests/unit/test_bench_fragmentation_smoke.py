"""benchmarks.bench_fragmentation runs with ``--quick --json --no-plot`` and its output holds together (never a speed check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._common import TRACES  # the benchmarks' own trace lookup

ROOT = Path(__file__).resolve().parents[2]
OPENB = TRACES / "alibaba-gpu-v2023"
NEEDED = ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv", "openb_pod_list_multigpu50.csv")
POLICIES = ["spread", "best-fit", "raygpu"]
TIMING = {"reclaim_s", "stranded_s"}


def run(*extra: str) -> dict:
    missing = [n for n in NEEDED if not (OPENB / n).exists()]
    if missing:
        pytest.skip(f"openb trace file(s) {', '.join(missing)} not found under {OPENB}")
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_fragmentation", "--quick", "--json", "--no-plot",
                          *extra],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def result() -> dict:
    return run()


def same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in TIMING | {"policy"}} == \
        {k: v for k, v in b.items() if k not in TIMING | {"policy"}}


def test_form(result: dict) -> None:
    assert result["benchmark"] == "fragmentation"
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["python"]
    assert result["plots"] == []  # --no-plot
    p = result["params"]
    assert p["rounds"] == 3 and 0 < p["churn"] < 1 and 0 <= p["warm"] <= 1
    rows = result["rows"]
    fill = [r for r in rows if r["phase"] == "fill"]
    churn = [r for r in rows if r["phase"] == "churn"]
    assert [(r["policy"], r["level"]) for r in fill] == [(pol, lv) for pol in POLICIES for lv in p["levels"]]
    assert [(r["policy"], r["round"]) for r in churn] == [(pol, k) for pol in POLICIES for k in range(1, 4)]


def test_counts_hold_together(result: dict) -> None:
    gpus = result["cluster"]["gpus"]
    for r in result["rows"]:
        assert r["gpus"] == gpus
        assert 0 <= r["unallocated_gpus"] <= gpus
        # the simulator's free GPUs and stranded_gpus' own count of them agree
        assert r["lib_free_gpus"] == pytest.approx(r["unallocated_gpus"])
        for k in ("stranded_integer", "stranded_cpu_mem", "stranded_fragment"):
            assert r[k] >= 0, k
        assert r["stranded_gpus"] == pytest.approx(r["stranded_integer"] + r["stranded_cpu_mem"]
                                                   + r["stranded_fragment"], abs=0.02)
        # (b) and (c) are free GPUs, each counted once; (a) is the rest of GPUs held by share workers
        assert r["stranded_cpu_mem"] + r["stranded_fragment"] <= r["unallocated_gpus"] + 1e-6
        assert r["stranded_integer"] < r["share_pods"] or r["stranded_integer"] == r["share_pods"] == 0
        assert 0 <= r["whole_free_8gpu_nodes"] <= result["cluster"]["nodes_8gpu"]
        assert 0 <= r["pending_8gpu_tasks"] <= r["pending_tasks"]
        if r["pending_tasks"] == 0:  # nothing waits: nothing is stranded but the integer model's rests
            assert r["stranded_cpu_mem"] == r["stranded_fragment"] == 0 and r["smallest_pending"] is None
        else:
            assert r["smallest_pending"] >= 1
        assert r["idle_worker_gpus"] <= gpus - r["unallocated_gpus"]


def test_fill_is_monotone_and_raygpu_is_best_fit_there(result: dict) -> None:
    fill = {pol: [r for r in result["rows"] if r["phase"] == "fill" and r["policy"] == pol] for pol in POLICIES}
    for rows in fill.values():
        for a, b in zip(rows, rows[1:]):  # nothing leaves while filling
            assert b["submitted"] > a["submitted"]
            assert b["failed"] >= a["failed"]
            assert b["unallocated_gpus"] <= a["unallocated_gpus"]
        for r in rows:
            assert r["failed"] == r["pending_tasks"]
            assert r["idle_worker_gpus"] == 0
    # the same tasks are offered to every policy at every level
    assert len({tuple(r["submitted"] for r in rows) for rows in fill.values()}) == 1
    assert all(same(a, b) for a, b in zip(fill["best-fit"], fill["raygpu"]))


def test_churn_rounds(result: dict) -> None:
    for r in (r for r in result["rows"] if r["phase"] == "churn"):
        assert r["arrived"] > 0 and r["arrived_gpus"] >= r["departed_gpus"]  # closed loop: what left comes back
        assert 0 <= r["placed_new"] <= r["arrived"]
        assert 0 <= r["arrived_8gpu"] <= r["arrived"]
        assert r["nodes_emptied"] <= r["removed_workers"]
        assert r["retried_placed"] >= 0 and r["removed_workers"] >= 0


def test_without_a_warm_pool_the_reclaimer_has_no_choice() -> None:
    """warm 0: every idle worker goes, so plan_reclaim and Ray's order remove the same set and raygpu = best-fit."""
    rows = run("--warm", "0")["rows"]
    bf = [r for r in rows if r["policy"] == "best-fit"]
    rg = [r for r in rows if r["policy"] == "raygpu"]
    assert len(bf) == len(rg) > 0
    assert all(same(a, b) for a, b in zip(bf, rg))
    assert all(r["idle_worker_gpus"] == 0 for r in rows if r["phase"] == "churn")
