"""Decision cost per cycle: raygpu's reconcile, plan_reclaim and plan_gang, and plan_reclaim beside Ray's scheduler.

Synthetic states, all made up here (no trace). The base is
``bench_reconcile.synthetic_snapshot`` (N GPU nodes of 8 GPUs, 2 Ray worker
pods of 4 GPUs each per node, 1% phantom pods, 1% zero-allocatable nodes, N/10
Pending pods); every 3rd Ray worker is idle for 700 s with all its resources
free, the others are busy (no GPU free); workers carry the Ray label
``zone`` = ``a`` or ``b``. Times are CPU seconds (``time.process_time``) and
wall seconds (``time.perf_counter``), each the minimum of ``--runs`` runs,
with the 1-minute load average when the size started (a busy box inflates
wall time, less so CPU time). The garbage of the previous run is collected
before each run; collections during a run are timed.

1. **raygpu's cycle** (no Ray counterpart for reconcile and plan_gang, so
   reported alone), as one cycle runs it: ``index_snapshot`` once, then
   ``reconcile(snapshot, now, index=ix)``; ``plan_reclaim(..., index=ix)`` with N/10
   pending placement groups of 2 x ``{"GPU": 4, "CPU": 8}`` (PACK, SPREAD and
   STRICT_SPREAD in turn) with label selectors (``zone: a`` or
   ``zone: in(a,b)``); ``plan_gang`` for N/10 requests of 4 x ``{"GPU": 1}``
   on a 1/4/8-GPU cluster (``gang_templates`` once per cycle). Each part is
   timed alone and the cycle as a whole (its total); a least-squares line and a
   log-log fit over the sizes give its growth (ms per 1,000 nodes, and the
   exponent: 1.0 is linear). The cycle runs with Python's cyclic garbage collector
   paused around it, as the sidecar and the doctor run their planners
   (``raygpu.plan.common.collector``); the column "GC on" times the same cycle with
   the collector running.
   Two yardsticks that do not depend on the box (``benchmarks/_decision_reference.py``):
   "ref", one plain pass that reads every pod, Ray node and node once (the
   box's cost of touching the data: total/ref compares boxes), and the Python
   lines the cycle executes, counted (linear work shows as constant lines/node).
2. **Like for like**: ``plan_reclaim`` and Ray's
   ``ResourceDemandScheduler.schedule`` (ray 2.60, autoscaler v2) on the same
   state, built from the same snapshot (one ``AutoscalerInstance`` per Ray
   worker with its total, available and idle time; idle timeout 600 s; node
   types ``gpu-group`` {GPU 4, CPU 8} with room to double and ``gpu8``
   {GPU 8, CPU 16} with none running), in three states:

   * ``none``: no pending demand (Ray terminates idle nodes, raygpu deletes idle workers);
   * ``scale-up``: N/10 pending ``{"GPU": 8, "CPU": 16}`` (raygpu: pending PGs of one such
     bundle), which fit no idle node: Ray launches ``gpu8`` nodes, raygpu protects nothing;
   * ``worst``: N/10 pending ``{"GPU": 4, "CPU": 8}``, which fit exactly on idle workers
     (Ray's worst case: requests x nodes, with deep copies; raygpu keeps the workers they need).

   Ray's ``schedule`` runs with the garbage collector paused, as raygpu's
   planners do. Ray runs a size only while its predicted time (from the previous sizes'
   growth) fits ``--ray-budget-s`` per run; the note says where it stopped.
3. **The worst pending shapes** (issue 24): a backlog of pending placement groups asking twice
   the GPUs of the idle workers (PACK, SPREAD and STRICT_SPREAD in turn), of 2 x ``{"GPU": 4,
   "CPU": 8}`` (``backlog-2x4``: half of them fit, each on two idle workers) and of 4 x
   ``{"GPU": 8}`` (``backlog-4x8``: only the 1% phantom workers take a bundle). ``plan_reclaim``
   and the whole cycle of part 1 with that backlog in place of its N/10 PGs, CPU and wall, the
   lines the cycle executes, the workers kept for the PGs, and whether the pending-PG search ran
   out of its step budget (``search_budget_spent``: it must not, up to 20,000 nodes). Part 1's cycle
   is all three planners on one index; the sidecar runs less: ``plan_cycle`` (``plan_gc``, then
   ``plan_reclaim`` with its own Ray join, no doctor index, no ``reconcile``, no ``plan_gang``), with the
   collector paused around it (``reclaim/loop.py``). The column "sidecar" times that call, on a
   ``CycleState`` of the same pods, Ray view and RayCluster (no reservations).
4. **``plan_gc``** at ``--gc-sizes`` reservations (1,000 to 16,000), each with its own worker
   group and state object, in turn live (its PG created), released, and its PG gone.
5. **Worst beside worst** (issue 27), at each size parts 2 and 3 ran: Ray's ``schedule`` in its three
   states beside raygpu's worst at the same size: ``plan_reclaim``'s worst over part 2's states and part
   3's shapes, the sidecar's ``plan_cycle`` at its worst shape, ``plan_gc`` with as many reservations as
   nodes (timed here), and their sum. Not like for like: Ray's ``schedule`` also plans the launches
   (scale-up), ``plan_reclaim`` only decides scale-down. With KubeRay's in-tree autoscaler on (raygpu
   scaling down beside it), both run every cycle, so the last column adds Ray's worst and raygpu's.

    python -m benchmarks.bench_decision_cost                      # 500 .. 10,000 nodes
    python -m benchmarks.bench_decision_cost --sizes 500,1000,2000,5000,10000,20000 --runs 3
    python -m benchmarks.bench_decision_cost --quick              # 50, 100 nodes (plan_gc: 100, 200)
    python -m benchmarks.bench_decision_cost --sizes 10000,20000 --only-backlog --gc-sizes 1000,16000
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import time

from benchmarks._common import machine, machine_line, print_table, save_plot
from benchmarks._decision_reference import executed_lines, reference_pass
from benchmarks.bench_reconcile import NOW_S, synthetic_snapshot
from raygpu.model.cycle import CycleState
from raygpu.model.gang import GangRequest
from raygpu.model.gc import ReservationRecord, SeenAt
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.raycluster import GroupTemplate
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.model.views import PgState, PlacementGroupView, RayView, Snapshot
from raygpu.plan.common.collector import collector_paused
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.gang.reservation import gang_templates, plan_gang
from raygpu.plan.doctor.checks_index import index_snapshot
from raygpu.plan.reclaim.cycle import plan_cycle
from raygpu.plan.reclaim.gc import plan_gc
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders import cluster_view

GiB = 2**30
FULL = (500, 1000, 2000, 5000, 10000)
QUICK = (50, 100)
MAX_SIZE = 20_000
IDLE_S = 700.0
STATES = ("none", "scale-up", "worst")
DEMAND = {"scale-up": {"GPU": 8.0, "CPU": 16.0}, "worst": {"GPU": 4.0, "CPU": 8.0}}
STRATEGIES = ("PACK", "SPREAD", "STRICT_SPREAD")
BACKLOGS = {"backlog-2x4": ({"GPU": 4.0, "CPU": 8.0},) * 2, "backlog-4x8": ({"GPU": 8.0},) * 4}
GC_SIZES = (1000, 2000, 4000, 8000, 16000)
GC_QUICK = (100, 200)


def with_idle_workers(snap: Snapshot) -> Snapshot:
    """Every 3rd Ray worker idle for IDLE_S with everything free, the others busy with no GPU free; a zone label."""
    nodes = []
    for i, n in enumerate(snap.ray.nodes):
        if n.is_head:
            nodes.append(n)
            continue
        idle = i % 3 == 0
        nodes.append(n.model_copy(update={
            "idle_since_s": NOW_S - IDLE_S if idle else None, "labels": {"zone": "ab"[i % 2]},
            "available": dict(n.total) if idle else {**n.total, "GPU": 0.0}}))
    return snap.model_copy(update={"ray": snap.ray.model_copy(update={"nodes": tuple(nodes)})})


def with_pending(snap: Snapshot, pgs: list[PlacementGroupView]) -> Snapshot:
    return snap.model_copy(update={"ray": snap.ray.model_copy(update={"placement_groups": tuple(pgs)})})


def cycle_pgs(n: int) -> list[PlacementGroupView]:
    """N/10 pending PGs of 2 x {GPU 4, CPU 8} with label selectors, strategies in turn."""
    return [PlacementGroupView(pg_id=f"pg{i:06d}", state=PgState.PENDING, strategy=STRATEGIES[i % 3],
                               bundles=({"GPU": 4.0, "CPU": 8.0},) * 2,
                               bundle_label_selectors=({"zone": "a" if i % 2 else "in(a,b)"},) * 2)
            for i in range(max(1, n // 10))]


def state_pgs(n: int, state: str) -> list[PlacementGroupView]:
    """The like-for-like state's pending demand as raygpu sees it: N/10 PGs of one bundle (none for ``none``)."""
    if state == "none":
        return []
    return [PlacementGroupView(pg_id=f"pg{i:06d}", state=PgState.PENDING, bundles=(DEMAND[state],))
            for i in range(max(1, n // 10))]


def idle_room_gpus(snap: Snapshot) -> float:
    """The GPUs free on idle Ray workers: what pending PGs could get by keeping them."""
    return sum(n.available.get("GPU", 0.0) for n in snap.ray.nodes if not n.is_head and n.idle_since_s is not None)


def backlog_pgs(snap: Snapshot, shape: str) -> list[PlacementGroupView]:
    """Pending PGs of ``BACKLOGS[shape]`` asking twice ``idle_room_gpus(snap)`` in all, strategies in turn."""
    bundles = BACKLOGS[shape]
    count = max(1, round(2 * idle_room_gpus(snap) / sum(b["GPU"] for b in bundles)))
    return [PlacementGroupView(pg_id=f"pg{i:06d}", state=PgState.PENDING, strategy=STRATEGIES[i % 3], bundles=bundles)
            for i in range(count)]


def gc_state(r: int) -> dict:
    """``plan_gc``'s arguments for ``r`` reservations of one RayCluster, each with its own raygpu worker group
    and state object: in turn live (its PG created), released, and its PG gone."""
    uid = "uid-rc"
    groups = tuple(GroupTemplate(group_name=f"rg-{i:05d}", replicas=1, min_replicas=1,
                                 template={"metadata": {"labels": {LABEL_RESERVATION: f"rg-{i:05d}"}}, "spec": {}})
                   for i in range(r))
    cluster = RayClusterView(name="rc", namespace="ns", uid=uid, head=GroupTemplate(group_name="head", is_head=True),
                             worker_groups=groups)
    states = ("ready", "released", "ready")
    records = [ReservationRecord(name=f"r{i:05d}", namespace="ns", group=f"rg-{i:05d}", cluster="rc",
                                 state=states[i % 3], placement_group_id=f"{i:08x}", created_at_s=NOW_S - 600,
                                 uid=f"u-{i}", owner_uids=(uid,), heartbeat_at_s=NOW_S - 5)
               for i in range(r)]
    ray = RayView(placement_groups=tuple(PlacementGroupView(pg_id=f"{i:08x}", state=PgState.CREATED,
                                                            bundles=({"GPU": 8.0},)) for i in range(r) if i % 3 != 2))
    seen = {rec.name: SeenAt(first_s=NOW_S - 600, heartbeat_s=NOW_S - 5) for rec in records}
    return {"reservations": records, "ray_view": ray, "now_s": NOW_S, "cluster": cluster, "seen": seen}


def reclaim_cluster(n: int) -> RayClusterView:
    res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": 4.0}
    res8 = {"cpu": 16.0, "memory": 128.0 * GiB, "nvidia.com/gpu": 8.0}
    return (cluster_view("rc", resource_version="1").head(limits={"cpu": 4, "memory": 16 * GiB})
            .group("gpu-group", replicas=2 * n, min_replicas=0, max_replicas=4 * n, limits=res, requests=res)
            .group("gpu8", replicas=0, min_replicas=0, max_replicas=n, limits=res8, requests=res8).obj())


def gang_cluster() -> RayClusterView:
    view = cluster_view("rc").head(limits={"cpu": 4, "memory": 16 * GiB})
    for k in (1, 4, 8):
        view.group(f"gpu{k}", max_replicas=10_000, limits={"cpu": 8 * k, "memory": 64 * k * GiB, "nvidia.com/gpu": k})
    return view.obj()


def ray_request(snap: Snapshot, n: int, state: str):
    """Ray's SchedulingRequest for the same state: one RAY_RUNNING instance per Ray worker of ``snap``."""
    from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
    from ray.autoscaler.v2.scheduler import SchedulingRequest
    from ray.autoscaler.v2.schema import AutoscalerInstance
    from ray.core.generated.autoscaler_pb2 import NodeState, ResourceRequest, ResourceRequestByCount
    from ray.core.generated.instance_manager_pb2 import Instance

    cfg = {"gpu-group": NodeTypeConfig(name="gpu-group", min_worker_nodes=0, max_worker_nodes=4 * n,
                                       resources={"CPU": 8.0, "GPU": 4.0}),
           "gpu8": NodeTypeConfig(name="gpu8", min_worker_nodes=0, max_worker_nodes=n,
                                  resources={"CPU": 16.0, "GPU": 8.0})}
    inst = []
    for i, rn in enumerate(x for x in snap.ray.nodes if not x.is_head):
        nid = f"{i + 1:056x}"
        im = Instance(instance_id=f"i-{i}", instance_type="gpu-group", status=Instance.RAY_RUNNING, node_id=nid,
                      cloud_instance_id=rn.instance_id, node_kind=2)  # 2 = WORKER
        idle_ms = int((NOW_S - rn.idle_since_s) * 1000) if rn.idle_since_s is not None else 0
        ns = NodeState(node_id=bytes.fromhex(nid), instance_id=rn.instance_id, ray_node_type_name="gpu-group",
                       total_resources=dict(rn.total), available_resources=dict(rn.available),
                       idle_duration_ms=idle_ms, labels=dict(rn.labels))
        inst.append(AutoscalerInstance(cloud_instance_id=rn.instance_id, ray_node=ns, im_instance=im))
    reqs = [] if state == "none" else [ResourceRequestByCount(
        request=ResourceRequest(resources_bundle=DEMAND[state]), count=max(1, n // 10))]
    return SchedulingRequest(disable_launch_config_check=True, node_type_configs=cfg, idle_timeout_s=600.0,
                             resource_requests=reqs, current_instances=inst)


def cycle(snap: Snapshot, rc: RayClusterView, policy: ReclaimPolicy, gcl: RayClusterView, reqs: list[GangRequest],
          unpaused: bool = False) -> None:
    """One decision cycle on ``snap``: one index, then reconcile, plan_reclaim and plan_gang reading it, with the
    garbage collector paused around it as the sidecar pauses it.

    ``unpaused``: the same calls with the garbage collector running (as ``plan_gang`` runs in a driver)."""
    if unpaused:
        return _cycle(snap, rc, policy, gcl, reqs)
    with collector_paused():
        return _cycle(snap, rc, policy, gcl, reqs)


def _cycle(snap: Snapshot, rc: RayClusterView, policy: ReclaimPolicy, gcl: RayClusterView,
           reqs: list[GangRequest]) -> None:
    ix = index_snapshot(snap)
    reconcile(snap, NOW_S, index=ix)
    plan_reclaim(snap, rc, policy, NOW_S, index=ix)
    templates = gang_templates(gcl)
    for r in reqs:
        plan_gang(r, gcl, templates=templates)


def paused(fn):
    """``fn`` with the garbage collector paused around it, as the sidecar runs its planners."""
    def run():
        with collector_paused():
            return fn()
    return run


def measure(fn, runs: int) -> tuple[float, float, object]:
    """(fastest CPU seconds, fastest wall seconds, the last output) over ``runs`` runs."""
    cpu, wall, out = math.inf, math.inf, None
    for _ in range(runs):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return cpu, wall, out


def fit(points: list[tuple[int, float]], per: str = "ms_per_1000_nodes") -> dict[str, float] | None:
    """Least-squares slope per 1,000 nodes (named ``per``: ms for (nodes, ms) points) and the log-log exponent
    (1.0: linear)."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mlx, mly = sum(lx) / len(lx), sum(ly) / len(ly)
    exponent = sum((a - mlx) * (b - mly) for a, b in zip(lx, ly)) / sum((a - mlx) ** 2 for a in lx)
    return {per: round(slope * 1000, 2), "loglog_exponent": round(exponent, 3)}


def ray_should_run(done: list[tuple[int, float]], n: int, budget_s: float, cap: int | None) -> str | None:
    """None to run Ray at ``n``, else why not: over ``--ray-max-nodes``, or its predicted time over the budget."""
    if cap is not None and n > cap:
        return f"not run: above --ray-max-nodes {cap}"
    if not done:
        return None if n <= 2000 else "not run: no size <= 2,000 measured first to predict its time from"
    (n1, t1), exponent = done[-1], 2.0  # quadratic until two sizes tell
    if len(done) >= 2 and done[-2][1] > 0:
        n0, t0 = done[-2]
        exponent = max(1.0, math.log(t1 / t0) / math.log(n1 / n0))
    predicted = t1 * (n / n1) ** exponent
    if predicted > budget_s:
        return (f"not run: predicted {predicted:.0f} s > --ray-budget-s {budget_s:.0f} "
                f"({t1:.1f} s at {n1:,} nodes, growth exponent {exponent:.2f})")
    return None


def plot(rows: list[dict], comparison: list[dict], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series = [("raygpu cycle (reconcile + plan_reclaim + plan_gang)", [(r["nodes"], r["raygpu_total_ms"]) for r in rows],
               dict(marker="o", lw=2, color="tab:green"))]
    colours = {"none": "tab:blue", "scale-up": "tab:orange", "worst": "tab:red"}
    for state in STATES:
        mine = [c for c in comparison if c["state"] == state]
        series.append((f"raygpu plan_reclaim, {state}", [(c["nodes"], c["raygpu_ms"]) for c in mine],
                       dict(marker="s", ls=":", color=colours[state])))
        series.append((f"Ray schedule(), {state}", [(c["nodes"], c["ray_ms"]) for c in mine if c["ray_ms"]],
                       dict(marker="D", color=colours[state])))
    for label, pts, kw in series:
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=label, **kw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([r["nodes"] for r in rows], [f"{r['nodes']:,}" for r in rows])
    ax.minorticks_off()
    ax.set_xlabel("Kubernetes GPU nodes (2 Ray workers each)")
    ax.set_ylabel("CPU ms per cycle (min of runs)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return save_plot(fig, name)


def sizes_arg(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes node counts separated by commas, got {text!r}") from None
    if not sizes or any(not 10 <= s <= MAX_SIZE for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes: each size must be 10 to {MAX_SIZE:,} nodes, got {text!r}")
    return tuple(sorted(set(sizes)))


def gc_sizes_arg(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gc-sizes takes reservation counts separated by commas, got {text!r}") \
            from None
    if any(not 1 <= s <= 2 * MAX_SIZE for s in sizes):
        raise argparse.ArgumentTypeError(f"--gc-sizes: each size must be 1 to {2 * MAX_SIZE:,} reservations, "
                                         f"got {text!r}")
    return tuple(sorted(set(sizes)))


def backlog_rows(n: int, base: Snapshot, rc: RayClusterView, policy: ReclaimPolicy, gcl: RayClusterView,
                 reqs: list[GangRequest], runs: int) -> list[dict]:
    """Part 3 at ``n`` nodes: per backlog shape, plan_reclaim and the whole cycle with that backlog pending."""
    out = []
    for shape in BACKLOGS:
        load = round(os.getloadavg()[0], 2)
        snap = with_pending(base, backlog_pgs(base, shape))
        rcpu, rwall, plan = measure(paused(lambda: plan_reclaim(snap, rc, policy, NOW_S)), runs)
        ccpu, cwall, _ = measure(lambda: cycle(snap, rc, policy, gcl, reqs), runs)
        state = CycleState(now_s=NOW_S, cluster=rc, pods=snap.k8s.pods, ray=snap.ray, policy=policy)
        scpu, swall, _ = measure(paused(lambda: plan_cycle(state)), runs)  # as reclaim/loop.py runs it
        with collector_paused():
            lines = executed_lines(lambda: cycle(snap, rc, policy, gcl, reqs))
        out.append({"nodes": n, "shape": shape, "pending_pgs": len(snap.ray.placement_groups),
                    "idle_room_gpus": idle_room_gpus(base), "load_avg_1m": load,
                    "reclaim_ms": round(rcpu * 1e3, 2), "reclaim_wall_ms": round(rwall * 1e3, 2),
                    "cycle_ms": round(ccpu * 1e3, 2), "cycle_wall_ms": round(cwall * 1e3, 2),
                    "sidecar_ms": round(scpu * 1e3, 2), "sidecar_wall_ms": round(swall * 1e3, 2),
                    "lines": lines, "lines_per_node": round(lines / n, 1),
                    "kept_for_pgs": sum(d.reason.value == "NeededByPendingPG" for d in plan.decisions),
                    "deletes": len(plan.deleted_pods), "search_budget_spent": plan.search_budget_spent,
                    "load_avg_1m_after": round(os.getloadavg()[0], 2)})
    return out


WORST_COLUMNS = [("nodes", "nodes", "d"), ("ray_none_ms", "Ray none", ".1f"), ("ray_scale_up_ms", "Ray scale-up", ".1f"),
                 ("ray_worst_ms", "Ray worst", ".1f"), ("reclaim_worst_ms", "plan_reclaim worst", ".1f"),
                 ("reclaim_worst_case", "its case", "s"), ("sidecar_worst_ms", "plan_cycle worst", ".1f"),
                 ("gc_ms", "plan_gc @N res.", ".1f"), ("raygpu_worst_ms", "raygpu worst", ".1f"),
                 ("both_worst_ms", "both, worst", ".1f")]


def worst_rows(sizes: tuple[int, ...], comparison: list[dict], backlog: list[dict], gc_at: dict[int, dict]) -> list[dict]:
    """Part 5: per size, Ray's schedule in each state beside raygpu's worst (plan_reclaim over part 2's states
    and part 3's shapes; the sidecar's plan_cycle at its worst shape plus plan_gc at N reservations), and the
    sum of both worsts (both run when the in-tree autoscaler is on). Sizes without part 2 are left out."""
    out = []
    for n in sizes:
        states = {c["state"]: c for c in comparison if c["nodes"] == n}
        shapes = [b for b in backlog if b["nodes"] == n]
        if not states or not shapes or n not in gc_at:
            continue
        cases = [(c["raygpu_ms"], c["state"]) for c in states.values()] + [(b["reclaim_ms"], b["shape"]) for b in shapes]
        reclaim_ms, case = max(cases)
        sidecar_ms = max(b["sidecar_ms"] for b in shapes)
        raygpu_ms = round(sidecar_ms + gc_at[n]["gc_ms"], 2)
        ray = {k: states[k]["ray_ms"] if k in states else None for k in ("none", "scale-up", "worst")}
        known = [v for v in ray.values() if v is not None]
        out.append({"nodes": n, "ray_none_ms": ray["none"], "ray_scale_up_ms": ray["scale-up"],
                    "ray_worst_ms": ray["worst"], "ray_worst_note": states.get("worst", {}).get("ray_note"),
                    "reclaim_worst_ms": reclaim_ms, "reclaim_worst_case": case, "sidecar_worst_ms": sidecar_ms,
                    "gc_ms": gc_at[n]["gc_ms"], "gc_reservations": gc_at[n]["reservations"],
                    "raygpu_worst_ms": raygpu_ms,
                    "both_worst_ms": round(max(known) + raygpu_ms, 2) if ray["worst"] is not None else None})
    return out


def gc_rows(sizes: tuple[int, ...], runs: int) -> list[dict]:
    """Part 4: plan_gc at each number of reservations."""
    out = []
    for r in sizes:
        load = round(os.getloadavg()[0], 2)
        args = gc_state(r)
        cpu, wall, plan = measure(paused(lambda: plan_gc(**args)), runs)
        out.append({"reservations": r, "load_avg_1m": load, "gc_ms": round(cpu * 1e3, 2),
                    "gc_wall_ms": round(wall * 1e3, 2), "to_release": len(plan.to_release),
                    "load_avg_1m_after": round(os.getloadavg()[0], 2)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 and 100 nodes")
    ap.add_argument("--sizes", type=sizes_arg, default=None, help=f"node counts, e.g. 500,1000,20000 (<= {MAX_SIZE:,})")
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement (the fastest is reported)")
    ap.add_argument("--ray-budget-s", type=float, default=60.0, help="longest predicted Ray run to start")
    ap.add_argument("--ray-max-nodes", type=int, default=None, help="largest size Ray's scheduler is run at")
    ap.add_argument("--gc-sizes", type=gc_sizes_arg, default=None,
                    help=f"plan_gc reservation counts (default {','.join(map(str, GC_SIZES))}; --quick: "
                         f"{','.join(map(str, GC_QUICK))}; empty: skip part 4)")
    ap.add_argument("--only-backlog", action="store_true", help="parts 3 and 4 only (the worst pending shapes, plan_gc)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    logging.getLogger("ray").setLevel(logging.ERROR)
    sizes = args.sizes or (QUICK if args.quick else FULL)
    policy = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
    gcl = gang_cluster()
    rows, comparison, backlog = [], [], []
    gc_at: dict[int, dict] = {}
    ray_done: dict[str, list[tuple[int, float]]] = {s: [] for s in STATES}
    ray_note: dict[str, str] = {}
    for n in sizes:
        load = round(os.getloadavg()[0], 2)
        base = with_idle_workers(synthetic_snapshot(n))
        rc = reclaim_cluster(n)
        snap = with_pending(base, cycle_pgs(n))
        reqs = [GangRequest(name=f"pg-{i}", cluster="rc", bundles=[{"GPU": 1.0}] * 4) for i in range(max(1, n // 10))]
        backlog += backlog_rows(n, base, rc, policy, gcl, reqs, args.runs)
        if args.only_backlog:
            continue
        gc_at[n] = gc_rows((n,), args.runs)[0]  # part 5: plan_gc with as many reservations as nodes
        ix = index_snapshot(snap)
        parts = {"index": lambda: index_snapshot(snap), "reconcile": lambda: reconcile(snap, NOW_S, index=ix),
                 "reclaim": lambda: plan_reclaim(snap, rc, policy, NOW_S, index=ix),
                 "gang": lambda: [plan_gang(r, gcl, templates=t) for t in [gang_templates(gcl)] for r in reqs]}
        timed = {key: measure(paused(fn), args.runs) for key, fn in parts.items()}
        del ix
        total = measure(lambda: cycle(snap, rc, policy, gcl, reqs), args.runs)
        gc_on = measure(lambda: cycle(snap, rc, policy, gcl, reqs, unpaused=True), args.runs)
        ref = measure(lambda: reference_pass(snap), args.runs)
        with collector_paused():
            lines = executed_lines(lambda: cycle(snap, rc, policy, gcl, reqs))
        recl = timed["reclaim"]
        row = {"nodes": n, "ray_nodes": len(snap.ray.nodes), "gpus": 8 * n, "pending_pgs": len(snap.ray.placement_groups),
               "load_avg_1m": load, "reclaim_deletes": len(recl[2].deleted_pods),
               "reclaim_kept_for_pgs": sum(d.reason.value == "NeededByPendingPG" for d in recl[2].decisions)}
        for key, (cpu, wall, _) in timed.items():
            row[f"{key}_ms"], row[f"{key}_wall_ms"] = round(cpu * 1e3, 2), round(wall * 1e3, 2)
        row["raygpu_total_ms"], row["raygpu_total_wall_ms"] = round(total[0] * 1e3, 2), round(total[1] * 1e3, 2)
        row["gc_on_total_ms"], row["gc_on_total_wall_ms"] = round(gc_on[0] * 1e3, 2), round(gc_on[1] * 1e3, 2)
        row["reference_ms"] = round(ref[0] * 1e3, 2)
        row["total_over_reference"] = round(total[0] / ref[0], 2) if ref[0] > 0 else None
        row["lines"], row["lines_per_node"] = lines, round(lines / n, 1)
        row["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        for state in STATES:
            s = with_pending(base, state_pgs(n, state))
            cpu, wall, plan = measure(paused(lambda: plan_reclaim(s, rc, policy, NOW_S)), args.runs)
            c = {"nodes": n, "state": state, "load_avg_1m": round(os.getloadavg()[0], 2),
                 "raygpu_ms": round(cpu * 1e3, 2), "raygpu_wall_ms": round(wall * 1e3, 2),
                 "raygpu_deletes": len(plan.deleted_pods), "ray_ms": None, "ray_wall_ms": None,
                 "ray_to_terminate": None, "ray_to_launch": None, "ray_over_raygpu": None, "ray_note": None}
            why = ray_note.get(state) or ray_should_run(ray_done[state], n, args.ray_budget_s, args.ray_max_nodes)
            if why is None:
                try:
                    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler

                    req = ray_request(s, n, state)

                    def ray_schedule():  # with the collector paused, as raygpu's planners run: like for like
                        with collector_paused():
                            return ResourceDemandScheduler().schedule(req)

                    first = measure(ray_schedule, 1)
                    more = measure(ray_schedule, args.runs - 1) \
                        if args.runs > 1 and first[0] * (args.runs - 1) <= args.ray_budget_s else None
                    rcpu, rwall, reply = (min(first[0], more[0]), min(first[1], more[1]), more[2]) if more else first
                    ray_done[state].append((n, rcpu))
                    c.update(ray_ms=round(rcpu * 1e3, 2), ray_wall_ms=round(rwall * 1e3, 2),
                             ray_to_terminate=len(reply.to_terminate),
                             ray_to_launch=sum(r.count for r in reply.to_launch),
                             ray_over_raygpu=round(rcpu / cpu, 2) if cpu > 0 else None)
                except Exception as e:  # noqa: BLE001 - say why, do not fake a number
                    why = f"not run: {type(e).__name__}: {e}"[:200]
            if why is not None:
                c["ray_note"] = why
                if why.startswith("not run: predicted"):
                    ray_note[state] = f"not run: stopped at a smaller size ({why[len('not run: '):]})"
            comparison.append(c)
    gc_plans = gc_rows(args.gc_sizes if args.gc_sizes is not None else GC_QUICK if args.quick else GC_SIZES, args.runs)
    fits = {key: fit([(r["nodes"], r[f"{key}_ms"]) for r in rows])
            for key in ("index", "reconcile", "reclaim", "gang", "raygpu_total", "gc_on_total", "reference")}
    for shape in BACKLOGS:
        mine = [b for b in backlog if b["shape"] == shape]
        fits[f"{shape}_cycle"] = fit([(b["nodes"], b["cycle_ms"]) for b in mine])
        fits[f"{shape}_lines"] = fit([(b["nodes"], b["lines"] / 1e3) for b in mine], per="thousand_lines_per_1000_nodes")
    fits["plan_gc"] = fit([(g["reservations"], g["gc_ms"]) for g in gc_plans], per="ms_per_1000_reservations")
    lines_fit = fit([(r["nodes"], r["lines"] / 1e3) for r in rows], per="thousand_lines_per_1000_nodes")
    worst = worst_rows(sizes, comparison, backlog, gc_at)
    plots = []
    if not args.no_plot and rows:
        plots.append(plot(rows, comparison, "decision_cost_quick.png" if args.quick else "decision_cost.png",
                          f"decision cost per cycle, CPU ms, min of {args.runs} runs (synthetic states)"))
    result = {"benchmark": "decision_cost", "runs": args.runs, "machine": machine(), "data": "synthetic",
              "ray_budget_s": args.ray_budget_s, "plots": plots, "rows": rows, "comparison": comparison,
              "backlog": backlog, "gc": gc_plans, "worst": worst, "fits": fits, "lines_fit": lines_fit}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"decision cost per cycle: CPU and wall ms, each the min of {args.runs} runs; synthetic states")
    print(machine_line(result["machine"]))
    print("\n1. raygpu's cycle (one index; N/10 pending PGs with label selectors; N/10 gang requests), CPU ms;"
          " total = the cycle timed whole; GC on = the same cycle with the garbage collector running")
    print_table(rows, [("nodes", "nodes", "d"), ("ray_nodes", "ray nodes", "d"), ("gpus", "GPUs", "d"),
                       ("index_ms", "index", ".1f"), ("reconcile_ms", "reconcile", ".1f"), ("reclaim_ms", "reclaim", ".1f"),
                       ("gang_ms", "gang", ".1f"), ("raygpu_total_ms", "total CPU ms", ".1f"),
                       ("raygpu_total_wall_ms", "total wall ms", ".1f"), ("gc_on_total_ms", "GC on CPU ms", ".1f"),
                       ("reference_ms", "ref ms", ".1f"), ("total_over_reference", "total/ref", ".1f"),
                       ("lines_per_node", "lines/node", ".1f"),
                       ("load_avg_1m", "load", ".2f"), ("load_avg_1m_after", "load after", ".2f")])
    print("  ref = one plain pass reading every pod, Ray node and node once (benchmarks/_decision_reference.py):"
          " this box's cost of touching the data; lines = Python lines the cycle executes (counted, not timed)")
    for key, f in fits.items():
        if f and "ms_per_1000_nodes" in f and not key.startswith("backlog"):
            print(f"  {key}: {f['ms_per_1000_nodes']:.1f} ms per 1,000 nodes (least squares), "
                  f"log-log exponent {f['loglog_exponent']:.2f} (1.0 = linear)")
    if lines_fit:
        print(f"  lines executed: {lines_fit['thousand_lines_per_1000_nodes']:.1f} thousand per 1,000 nodes (least squares), "
              f"log-log exponent {lines_fit['loglog_exponent']:.3f} (1.0 = linear)")
    print("\n2. plan_reclaim vs Ray's ResourceDemandScheduler.schedule(), same state (CPU ms)")
    print_table(comparison, [("nodes", "nodes", "d"), ("state", "state", "s"), ("raygpu_ms", "plan_reclaim", ".1f"),
                             ("ray_ms", "Ray schedule", ".1f"), ("ray_over_raygpu", "Ray/raygpu", ".2f"),
                             ("raygpu_deletes", "raygpu deletes", "d"), ("ray_to_terminate", "Ray terminates", "d"),
                             ("ray_to_launch", "Ray launches", "d"), ("load_avg_1m", "load", ".2f")])
    for c in comparison:
        if c["ray_note"]:
            print(f"  {c['nodes']:,} nodes, {c['state']}: Ray {c['ray_note']}")
    print("\n3. The worst pending shapes: pending PGs asking twice the idle workers' GPUs (CPU and wall ms;"
          " cycle = part 1's cycle with this backlog; sidecar = plan_cycle, the sidecar's decision)")
    print_table(backlog, [("nodes", "nodes", "d"), ("shape", "shape", "s"), ("pending_pgs", "pending PGs", "d"),
                          ("reclaim_ms", "plan_reclaim", ".1f"), ("reclaim_wall_ms", "wall", ".1f"),
                          ("cycle_ms", "cycle CPU ms", ".1f"), ("cycle_wall_ms", "cycle wall ms", ".1f"),
                          ("sidecar_ms", "sidecar CPU ms", ".1f"), ("sidecar_wall_ms", "sidecar wall ms", ".1f"),
                          ("lines_per_node", "lines/node", ".1f"), ("kept_for_pgs", "kept for PGs", "d"),
                          ("deletes", "deletes", "d"), ("load_avg_1m", "load", ".2f"),
                          ("load_avg_1m_after", "load after", ".2f")])
    for b in backlog:
        if b["search_budget_spent"]:
            print(f"  {b['nodes']:,} nodes, {b['shape']}: search budget spent: {b['search_budget_spent']}")
    for shape in BACKLOGS:
        f, lf = fits[f"{shape}_cycle"], fits[f"{shape}_lines"]
        if f and lf:
            print(f"  {shape} cycle: log-log exponent {f['loglog_exponent']:.2f} (CPU), "
                  f"{lf['loglog_exponent']:.3f} (lines); 1.0 = linear")
    print("\n4. plan_gc (CPU and wall ms)")
    print_table(gc_plans, [("reservations", "reservations", "d"), ("gc_ms", "plan_gc", ".1f"),
                           ("gc_wall_ms", "wall", ".1f"), ("to_release", "to release", "d"),
                           ("load_avg_1m", "load", ".2f"), ("load_avg_1m_after", "load after", ".2f")])
    if fits["plan_gc"]:
        print(f"  plan_gc: log-log exponent {fits['plan_gc']['loglog_exponent']:.2f} (1.0 = linear)")
    if worst:
        print("\n5. Worst beside worst (CPU ms). Not like for like: Ray's schedule() also plans the launches, "
              "plan_reclaim only decides scale-down.\n   With KubeRay's in-tree autoscaler on, both run every cycle: "
              "their costs add (last column: Ray's worst + raygpu's worst)")
        print_table(worst, WORST_COLUMNS)
        for w in worst:
            if w["ray_worst_note"]:
                print(f"  {w['nodes']:,} nodes: Ray worst {w['ray_worst_note']}")
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
