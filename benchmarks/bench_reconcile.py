"""How long one doctor cycle (``reconcile``) takes as the cluster grows.

Synthetic snapshots, all of it made up here (no trace is used): N GPU nodes
of 8 GPUs, 2 Ray worker pods of 4 GPUs per node, each with its live Ray node
and an NVML view of 4 devices, plus a head pod. 1% of pods carry a fault
(phantom num-gpus), 1% of nodes have allocatable 0, and N/10 pods are
Pending, so that the fault paths, the taint check and the fragment
arithmetic all do work. Timed: ``reconcile(snapshot, now_s)`` only (building
the snapshot is not), median of ``--runs`` runs.

    python benchmarks/bench_reconcile.py            # 500, 1000, 2000, 5000 nodes
    python benchmarks/bench_reconcile.py --quick    # 50, 100 nodes
    python benchmarks/bench_reconcile.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raygpu.model.views import (  # noqa: E402
    DevicePluginPod,
    K8sNodeView,
    K8sPodView,
    K8sView,
    NvmlDeviceView,
    NvmlView,
    RayNodeView,
    RayView,
    Snapshot,
)
from raygpu.plan.doctor.reconcile import reconcile  # noqa: E402

GiB = 2**30
NOW_S = 1_000_000.0
FULL = (500, 1000, 2000, 5000)
QUICK = (50, 100)


def _devices(node_id: str, n: int) -> tuple[NvmlDeviceView, ...]:
    return tuple(
        NvmlDeviceView(index=i, uuid=f"GPU-{node_id}-{i}", name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GiB)
        for i in range(n)
    )


def synthetic_snapshot(n_nodes: int, gpus_per_node: int = 8, pods_per_node: int = 2) -> Snapshot:
    per_pod = gpus_per_node // pods_per_node
    nodes, pods, dps, ray_nodes, nvml = [], [], [], [], {}
    head = K8sPodView(name="rc-head", namespace="default", node_name="cpu-0", phase="Running",
                      requests={"cpu": 4, "memory": 16 * GiB}, ray_cluster="rc", ray_group="headgroup", ray_node_type="head")
    pods.append(head)
    ray_nodes.append(RayNodeView(node_id="r-head", alive=True, is_head=True, instance_id="rc-head", total={"CPU": 4}))
    nodes.append(K8sNodeView(name="cpu-0", capacity={"cpu": 32, "memory": 128 * GiB}, allocatable={"cpu": 32, "memory": 128 * GiB}))
    k = 0
    for n in range(n_nodes):
        name = f"gpu-{n:05d}"
        cap = {"cpu": 96.0, "memory": 1024.0 * GiB, "nvidia.com/gpu": float(gpus_per_node)}
        alloc = dict(cap)
        if n % 100 == 99:
            alloc["nvidia.com/gpu"] = 0.0  # 1%: zero allocatable
        nodes.append(K8sNodeView(name=name, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                    "nvidia.com/gpu.count": str(gpus_per_node)},
                                 capacity=cap, allocatable=alloc))
        dps.append(DevicePluginPod(name=f"dp-{name}", namespace="gpu-operator", node_name=name, ready=True))
        for p in range(pods_per_node):
            k += 1
            pod_name = f"rc-gpu-{n:05d}-{p}"
            phantom = k % 100 == 0  # 1%: num-gpus larger than the limit
            res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": float(per_pod)}
            pods.append(K8sPodView(name=pod_name, namespace="default", node_name=name, phase="Running",
                                   requests=res, limits=res, ray_cluster="rc", ray_group="gpu-group",
                                   ray_node_type="worker", ray_start_num_gpus=per_pod * 2.0 if phantom else None))
            ray_gpus = per_pod * 2.0 if phantom else float(per_pod)
            rid = f"r-{pod_name}"
            ray_nodes.append(RayNodeView(node_id=rid, alive=True, instance_id=pod_name, node_type="gpu-group",
                                         total={"CPU": 8.0, "GPU": ray_gpus}, available={"CPU": 8.0, "GPU": ray_gpus}))
            nvml[rid] = NvmlView(node_id=rid, available=True, driver_version="550.54.15", cuda_version="12.4",
                                 devices=_devices(rid, per_pod))
    for q in range(max(1, n_nodes // 10)):
        res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": float(gpus_per_node)}
        pods.append(K8sPodView(name=f"rc-pending-{q}", namespace="default", phase="Pending", requests=res, limits=res,
                               created_at_s=NOW_S, ray_cluster="rc", ray_group="gpu-group", ray_node_type="worker"))
    return Snapshot(
        taken_at_s=NOW_S, cluster="rc", namespace="default",
        ray=RayView(nodes=tuple(ray_nodes)),
        k8s=K8sView(nodes=tuple(nodes), pods=tuple(pods), device_plugin_pods=tuple(dps)),
        nvml=nvml,
    )


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


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,  # a busy box skews timings
    }


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
    print(f"machine: {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}, load avg {m['load_avg_1m']}")
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
