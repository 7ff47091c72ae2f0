"""Decision cost per cycle: raygpu's reconcile, reclaim and gang planning vs Ray's ResourceDemandScheduler.

Synthetic states, all made up here (no trace): the snapshot of
``bench_reconcile.synthetic_snapshot`` (N GPU nodes of 8 GPUs, 2 Ray worker
pods of 4 GPUs per node, 1% phantom pods, 1% zero-allocatable nodes, N/10
Pending pods), with every 3rd Ray worker idle for 700 s so that the reclaimer
has candidates. Timed per cycle, median of ``--runs``:

* ``reconcile``: ``raygpu.plan.doctor.reconcile.reconcile(snapshot, now)``.
* ``reclaim``: ``raygpu.plan.reclaim.plan_reclaim`` on the same snapshot and a
  RayCluster whose group ``gpu-group`` has replicas = 2N (idle timeout 600 s).
* ``gang``: ``raygpu.plan.gang.plan_gang`` for N/10 pending placement groups of
  4 bundles ``{"GPU": 1}`` each (one per Pending pod), on a 1/4/8-GPU cluster.
* ``ray``: ``ray.autoscaler.v2.scheduler.ResourceDemandScheduler.schedule`` on
  the same state: 2N RAY_RUNNING instances of node type ``gpu-group``
  (GPU 4, CPU 8), the same idle workers (idle_duration 700 s, idle timeout
  600 s) and N/10 pending resource requests ``{"GPU": 4, "CPU": 8}``. It is
  quadratic or worse in the node count here (5 s at 500 nodes and 200 s at
  2,000 on this box), so it runs only up to ``--ray-max-nodes`` (1,000; quick:
  100); larger sizes print "not run".

Plot (unless ``--no-plot``): ms per cycle vs nodes, log-log, each raygpu
planner, their sum and Ray's scheduler, in
``benchmarks/results/decision_cost.png`` (``decision_cost_quick.png``).

    python -m benchmarks.bench_decision_cost            # 500 .. 10,000 nodes
    python -m benchmarks.bench_decision_cost --quick    # 50, 100 nodes
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time

from benchmarks._common import machine, machine_line, print_table, save_plot
from benchmarks.bench_reconcile import NOW_S, synthetic_snapshot
from raygpu.model.gang import GangRequest
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.plan.gang import plan_gang
from raygpu.plan.reclaim import plan_reclaim
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.testing.builders import cluster_view

GiB = 2**30
FULL = (500, 1000, 2000, 5000, 10000)
QUICK = (50, 100)
IDLE_S = 700.0


def with_idle_workers(snap):
    nodes = [n.model_copy(update={"idle_since_s": NOW_S - IDLE_S}) if (not n.is_head and i % 3 == 0) else n
             for i, n in enumerate(snap.ray.nodes)]
    return snap.model_copy(update={"ray": snap.ray.model_copy(update={"nodes": tuple(nodes)})})


def reclaim_cluster(n: int) -> RayClusterView:
    res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": 4.0}
    return (cluster_view("rc", resource_version="1").head(limits={"cpu": 4, "memory": 16 * GiB})
            .group("gpu-group", replicas=2 * n, min_replicas=0, max_replicas=4 * n, limits=res, requests=res).obj())


def gang_cluster() -> RayClusterView:
    view = cluster_view("rc").head(limits={"cpu": 4, "memory": 16 * GiB})
    for k in (1, 4, 8):
        view.group(f"gpu{k}", max_replicas=10_000, limits={"cpu": 8 * k, "memory": 64 * k * GiB, "nvidia.com/gpu": k})
    return view.obj()


def ray_request(n: int):
    from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
    from ray.autoscaler.v2.scheduler import SchedulingRequest
    from ray.autoscaler.v2.schema import AutoscalerInstance
    from ray.core.generated.autoscaler_pb2 import NodeState, ResourceRequest, ResourceRequestByCount
    from ray.core.generated.instance_manager_pb2 import Instance

    cfg = {"gpu-group": NodeTypeConfig(name="gpu-group", min_worker_nodes=0, max_worker_nodes=4 * n,
                                       resources={"CPU": 8.0, "GPU": 4.0, "memory": 64.0 * GiB})}
    inst = []
    for i in range(2 * n):
        nid = f"{i + 1:056x}"
        idle = i % 3 == 0
        im = Instance(instance_id=f"i-{i}", instance_type="gpu-group", status=Instance.RAY_RUNNING, node_id=nid,
                      cloud_instance_id=f"pod-{i}", node_kind=2)  # 2 = WORKER
        rn = NodeState(node_id=bytes.fromhex(nid), instance_id=f"pod-{i}", ray_node_type_name="gpu-group",
                       total_resources={"CPU": 8.0, "GPU": 4.0},
                       available_resources={"CPU": 8.0, "GPU": 4.0 if idle else 0.0},
                       idle_duration_ms=int(IDLE_S * 1000) if idle else 0)
        inst.append(AutoscalerInstance(cloud_instance_id=f"pod-{i}", ray_node=rn, im_instance=im))
    reqs = [ResourceRequestByCount(request=ResourceRequest(resources_bundle={"GPU": 4.0, "CPU": 8.0}),
                                   count=max(1, n // 10))]
    return SchedulingRequest(disable_launch_config_check=True, node_type_configs=cfg, idle_timeout_s=600.0,
                             resource_requests=reqs, current_instances=inst)


def timed(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def plot(rows: list[dict], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label, kw in (("reconcile_ms", "raygpu reconcile", dict(marker="o", ls=":", color="tab:blue")),
                           ("reclaim_ms", "raygpu plan_reclaim", dict(marker="s", ls=":", color="tab:orange")),
                           ("gang_ms", "raygpu plan_gang (N/10 PGs)", dict(marker="^", ls=":", color="tab:purple")),
                           ("raygpu_total_ms", "raygpu, the three together", dict(marker="o", lw=2, color="tab:green")),
                           ("ray_ms", "Ray ResourceDemandScheduler.schedule", dict(marker="D", lw=2, color="tab:red"))):
        pts = [(r["nodes"], r[key]) for r in rows if r.get(key)]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=label, **kw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([r["nodes"] for r in rows], [f"{r['nodes']:,}" for r in rows])
    ax.minorticks_off()
    ax.set_xlabel("Kubernetes GPU nodes (2 Ray workers each)")
    ax.set_ylabel("ms per cycle")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_plot(fig, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 and 100 nodes")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ray-max-nodes", type=int, default=None, help="largest size Ray's scheduler is run at")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    logging.getLogger("ray").setLevel(logging.ERROR)
    sizes = QUICK if args.quick else FULL
    ray_max = args.ray_max_nodes or (100 if args.quick else 1000)
    policy = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
    gc_cluster = gang_cluster()
    rows = []
    for n in sizes:
        snap = with_idle_workers(synthetic_snapshot(n))
        rc = reclaim_cluster(n)
        reqs = [GangRequest(name=f"pg-{i}", cluster="rc", bundles=[{"GPU": 1.0}] * 4) for i in range(max(1, n // 10))]
        rec_s, _ = timed(lambda: reconcile(snap, NOW_S), args.runs)
        recl_s, plan = timed(lambda: plan_reclaim(snap, rc, policy, NOW_S), args.runs)
        gang_s, _ = timed(lambda: [plan_gang(r, gc_cluster) for r in reqs], args.runs)
        row = {"nodes": n, "ray_nodes": len(snap.ray.nodes), "pending": len(reqs),
               "reconcile_ms": round(rec_s * 1e3, 2), "reclaim_ms": round(recl_s * 1e3, 2),
               "reclaim_deletes": len(plan.deleted_pods), "gang_ms": round(gang_s * 1e3, 2),
               "ray_ms": None, "ray_to_terminate": None, "ray_note": None}
        if n <= ray_max:
            try:
                from ray.autoscaler.v2.scheduler import ResourceDemandScheduler

                req = ray_request(n)
                ray_s, reply = timed(lambda: ResourceDemandScheduler().schedule(req), 1 if n >= 500 else args.runs)
                row["ray_ms"] = round(ray_s * 1e3, 2)
                row["ray_to_terminate"] = len(reply.to_terminate)
            except Exception as e:  # noqa: BLE001 - say why, do not fake a number
                row["ray_note"] = f"not run: {type(e).__name__}: {e}"[:200]
        else:
            row["ray_note"] = f"not run: above --ray-max-nodes {ray_max} (super-linear; 2,000 nodes took ~200 s)"
        raygpu_ms = row["reconcile_ms"] + row["reclaim_ms"] + row["gang_ms"]
        row["raygpu_total_ms"] = round(raygpu_ms, 2)
        row["ray_over_raygpu"] = round(row["ray_ms"] / raygpu_ms, 2) if row["ray_ms"] else None
        rows.append(row)
    plots = []
    if not args.no_plot:
        plots.append(plot(rows, "decision_cost_quick.png" if args.quick else "decision_cost.png",
                          f"decision cost per cycle (synthetic states, median of {args.runs} runs; "
                          f"Ray's scheduler up to {ray_max} nodes)"))
    result = {"benchmark": "decision_cost", "runs": args.runs, "machine": machine(), "data": "synthetic",
              "plots": plots, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"decision cost per cycle, median of {args.runs} runs (Ray at >=500 nodes: 1 run); synthetic states")
    print(machine_line(result["machine"]))
    print_table(rows, [("nodes", "nodes", "d"), ("ray_nodes", "ray nodes", "d"), ("reconcile_ms", "reconcile ms", ".1f"),
                       ("reclaim_ms", "reclaim ms", ".1f"), ("gang_ms", "gang ms", ".1f"),
                       ("raygpu_total_ms", "raygpu ms", ".1f"), ("ray_ms", "Ray RDS ms", ".1f"),
                       ("ray_over_raygpu", "Ray/raygpu", ".2f")])
    for r in rows:
        if r["ray_note"]:
            print(f"  {r['nodes']} nodes: Ray {r['ray_note']}")
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
