"""How long one doctor cycle (``reconcile``) takes as the cluster grows.

Synthetic snapshots, all of it made up here (no trace is used): N GPU nodes
of 8 GPUs, 2 Ray worker pods of 4 GPUs per node, each with its live Ray node
and an NVML view of 4 devices, plus a head pod. 1% of pods carry a fault
(phantom num-gpus), 1% of nodes have allocatable 0, and N/10 pods are
Pending, so that the fault paths, the taint check and the fragment
arithmetic all do work. Timed: ``reconcile(snapshot, now_s)`` only (building
the snapshot is not), median of ``--runs`` runs.

    python -m benchmarks.bench_reconcile            # 500, 1000, 2000, 5000 nodes
    python -m benchmarks.bench_reconcile --quick    # 50, 100 nodes
    python -m benchmarks.bench_reconcile --json     # machine-readable
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from benchmarks._common import machine, machine_line
from raygpu.model.views import Snapshot
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.testing.builders import snap

GiB = 2**30
NOW_S = 1_000_000.0
FULL = (500, 1000, 2000, 5000)
QUICK = (50, 100)


def synthetic_snapshot(n_nodes: int, gpus_per_node: int = 8, pods_per_node: int = 2) -> Snapshot:
    per_pod = gpus_per_node // pods_per_node
    b = (snap(NOW_S, ids=False)
         .ray_pod("rc-head", "cpu-0", head=True, requests={"cpu": 4, "memory": 16 * GiB}, limits={})
         .ray_node("r-head", "rc-head", head=True, total={"CPU": 4}, available={})
         .cpu_node("cpu-0"))
    k = 0
    for n in range(n_nodes):
        name = f"gpu-{n:05d}"
        b.gpu_node(name, gpus_per_node, allocatable=0.0 if n % 100 == 99 else None,  # 1%: zero allocatable
                   device_plugin_pod=f"dp-{name}")
        for p in range(pods_per_node):
            k += 1
            pod_name = f"rc-gpu-{n:05d}-{p}"
            phantom = k % 100 == 0  # 1%: num-gpus larger than the limit
            res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": float(per_pod)}
            ray_gpus = per_pod * 2.0 if phantom else float(per_pod)
            rid = f"r-{pod_name}"
            (b.ray_pod(pod_name, name, requests=res, num_gpus=per_pod * 2.0 if phantom else None)
             .ray_node(rid, pod_name, total={"CPU": 8.0, "GPU": ray_gpus}, node_type="gpu-group")
             .nvml(rid, devices=per_pod))
    for q in range(max(1, n_nodes // 10)):
        res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": float(gpus_per_node)}
        b.ray_pod(f"rc-pending-{q}", requests=res, created_at_s=NOW_S)
    return b.obj()


def time_reconcile(snapshot: Snapshot, runs: int) -> tuple[float, float, int]:
    """Median and fastest seconds of one reconcile() over ``runs`` runs, and its finding count.

    The garbage of the previous run is collected before each run (as between
    two sidecar cycles); collections during the run are timed.
    """
    times, findings = [], 0
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        report = reconcile(snapshot, NOW_S)
        times.append(time.perf_counter() - t0)
        findings = len(report.findings)
    return statistics.median(times), min(times), findings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 and 100 nodes only")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per size (median reported)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    rows = []
    prev = None
    for n in QUICK if args.quick else FULL:
        snap = synthetic_snapshot(n)
        median_s, min_s, findings = time_reconcile(snap, args.runs)
        row = {
            "nodes": n,
            "pods": len(snap.k8s.pods),
            "ray_nodes": len(snap.ray.nodes),
            "findings": findings,
            "median_ms": round(median_s * 1e3, 2),
            "min_ms": round(min_s * 1e3, 2),
            "us_per_node": round(median_s * 1e6 / n, 1),
            # time growth over node growth vs the previous size: 1.0 = linear
            "growth_vs_linear": round((median_s / prev[1]) / (n / prev[0]), 2) if prev else None,
        }
        rows.append(row)
        prev = (n, median_s)
    result = {"benchmark": "reconcile", "runs": args.runs, "machine": machine(), "data": "synthetic", "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["machine"]
    print(f"reconcile() per cycle, median of {args.runs} runs; synthetic snapshots (8 GPUs/node, 2 Ray pods/node)")
    print(machine_line(m))
    header = (f"{'nodes':>6} {'pods':>7} {'ray nodes':>9} {'findings':>8} {'median ms':>10} {'min ms':>8} "
              f"{'us/node':>8} {'growth/linear':>13}")
    print(header)
    for r in rows:
        growth = "-" if r["growth_vs_linear"] is None else f"{r['growth_vs_linear']:.2f}"
        print(f"{r['nodes']:>6} {r['pods']:>7} {r['ray_nodes']:>9} {r['findings']:>8} {r['median_ms']:>10.2f} {r['min_ms']:>8.2f} "
              f"{r['us_per_node']:>8.1f} {growth:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
