"""The fragmentation benchmark's simulation: placement, churn and scale-down on the openb cluster, one policy a run.

Stranded GPUs come from ``stranded_gpus`` and raygpu's scale-down from
``plan_reclaim``; see ``bench_fragmentation.py`` for the model and the policies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from benchmarks._fragmentation_tasks import Task, unit
from raygpu.model.raycluster import GroupTemplate
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.model.views import Snapshot
from raygpu.plan.doctor.stranded import stranded_gpus
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders import cluster_view, snap

MiB = 2**20
GROUPS = ("gpu1", "gpu2", "gpu4", "gpu8", "share")
CLUSTER, NS = "openb", "default"
ROUND_S = 3600.0
IDLE_TIMEOUT_S = 300.0
T0 = 1_000_000.0  # simulated clock at the start of the churn phase
NO_SHAPE = GroupTemplate(group_name="no-pending-work", requests={"cpu": 0.0})  # a GPU-less shape: (b) off


@dataclass
class Pod:
    pid: int
    group: str
    gpus: int
    cpu: int
    mem: int
    node: int
    created_s: float
    tasks: dict[str, Task] = field(default_factory=dict)
    used_milli: int = 0  # share pods: GPU milli used by Ray tasks
    used_cpu: int = 0
    used_mem: int = 0
    idle_since: float | None = None

    @property
    def name(self) -> str:
        return f"{CLUSTER}-{self.group}-{self.pid:05d}"


class Sim:
    def __init__(self, policy: str, nodes: list[dict[str, str]]) -> None:
        self.policy = policy
        self.node_names = [r["sn"] for r in nodes]
        self.cap = np.array([[int(r["gpu"]), int(r["cpu_milli"]), int(r["memory_mib"])] for r in nodes],
                            dtype=np.float64)
        self.used = np.zeros_like(self.cap)
        self.pods: dict[int, Pod] = {}
        self.on_node: list[set[int]] = [set() for _ in nodes]
        self.pending: list[Task] = []
        self.task_pod: dict[str, int] = {}
        self.share: dict[int, Pod] = {}  # share workers, busy or idle, by pid (creation order)
        self.idle: dict[str, dict[int, Pod]] = {g: {} for g in GROUPS}  # idle workers per group, creation order
        self.seq = 0
        self.now = 0.0
        self.failed = 0  # tasks whose first placement attempt found no node (queue retries do not count)
        self.reclaim_s = 0.0
        self.stranded_s = 0.0

    # ------------------------------------------------------------ placement
    def pick_node(self, g: int, c: int, m: int) -> int:
        req = np.array([g, c, m], dtype=np.float64)
        after = self.used + req
        ok = np.all(after <= self.cap + 1e-9, axis=1)
        if not ok.any():
            return -1
        frac = (after / self.cap).mean(axis=1)  # NodeResourcesFit, equal weights: allocated share after placing
        score = np.where(ok, frac if self.policy == "spread" else -frac, np.inf)
        return int(np.argmin(score))  # LeastAllocated: least allocated after; MostAllocated: most; ties: lowest index

    def new_pod(self, group: str, shape: tuple[int, int, int]) -> Pod | None:
        n = self.pick_node(*shape)
        if n < 0:
            return None
        self.seq += 1
        pod = Pod(self.seq, group, shape[0], shape[1], shape[2], n, self.now)
        self.pods[pod.pid] = pod
        if group == "share":
            self.share[pod.pid] = pod
        self.on_node[n].add(pod.pid)
        self.used[n] += shape
        return pod

    def submit(self, t: Task) -> bool:
        pod = None
        if t.frac:  # Ray packs it onto the share worker whose GPU is tightest after adding it
            best = None
            for p in self.share.values():
                if p.used_milli + t.milli <= 1000 and p.used_cpu + t.cpu <= p.cpu and p.used_mem + t.mem <= p.mem:
                    key = (1000 - p.used_milli - t.milli, p.pid)
                    if best is None or key < best[0]:
                        best = (key, p)
            pod = best[1] if best else None
        else:  # a warm idle worker of its own group that covers its CPU and memory, in creation order
            pod = next((p for p in self.idle[t.group].values() if p.cpu >= t.cpu and p.mem >= t.mem), None)
        if pod is None:
            pod = self.new_pod(t.group, t.pod_shape())
            if pod is None:
                return False
        pod.tasks[t.name] = t
        pod.used_milli += t.milli if t.frac else 1000 * t.gpus
        pod.used_cpu += t.cpu
        pod.used_mem += t.mem
        pod.idle_since = None
        self.idle[pod.group].pop(pod.pid, None)
        self.task_pod[t.name] = pod.pid
        return True

    def offer(self, t: Task) -> None:
        if not self.submit(t):
            self.failed += 1
            self.pending.append(t)

    def retry_pending(self) -> int:
        waiting, self.pending = self.pending, []
        placed = 0
        for t in waiting:
            if self.submit(t):
                placed += 1
            else:
                self.pending.append(t)
        return placed

    def depart(self, name: str, at_s: float) -> None:
        pod = self.pods[self.task_pod.pop(name)]
        t = pod.tasks.pop(name)
        pod.used_milli -= t.milli if t.frac else 1000 * t.gpus
        pod.used_cpu -= t.cpu
        pod.used_mem -= t.mem
        if not pod.tasks:
            pod.idle_since = at_s
            self.idle[pod.group][pod.pid] = pod

    def remove_pod(self, pid: int) -> None:
        pod = self.pods.pop(pid)
        assert not pod.tasks, pod.name
        self.share.pop(pid, None)
        self.idle[pod.group].pop(pid, None)
        self.on_node[pod.node].discard(pid)
        self.used[pod.node] -= (pod.gpus, pod.cpu, pod.mem)

    # ------------------------------------------------------------ scale-down
    def scale_down(self, warm: float, fresh: dict[str, int]) -> tuple[int, int]:
        """Remove all but ceil(warm x fresh[g]) idle workers of each group g; return (removed, nodes emptied).

        ``fresh[g]``: workers of g that went idle this round. The warm pool is sized on them, so it does not
        compound over rounds; the candidates are all idle workers, old and new.
        """
        idle = {g: list(self.idle[g].values()) for g in GROUPS}
        quota = {g: max(0, len(ps) - math.ceil(warm * fresh.get(g, 0) - 1e-9)) for g, ps in idle.items()}
        if self.policy == "raygpu":
            chosen = self.reclaim_choice(quota)
        else:  # Ray autoscaler v2 order: longest idle first (util 0 for all idle nodes), then creation order
            chosen = [p.pid for g, ps in idle.items()
                      for p in sorted(ps, key=lambda p: (p.idle_since, p.pid))[: quota[g]]]
        touched = {self.pods[pid].node for pid in chosen}
        for pid in chosen:
            self.remove_pod(pid)
        return len(chosen), sum(1 for n in touched if not self.on_node[n])

    def reclaim_choice(self, quota: dict[str, int]) -> list[int]:
        snap = self.snapshot(with_pending=False)
        counts = {g: sum(1 for p in self.pods.values() if p.group == g) for g in GROUPS}
        view = cluster_view(CLUSTER, NS, resource_version="1", autoscaling_enabled=True).head("head", requests={"cpu": 4.0})
        for g in GROUPS:
            view.group(g, replicas=counts[g], min_replicas=counts[g] - quota[g], max_replicas=100_000)
        cluster = view.obj()
        policy = ReclaimPolicy(idle_timeout_s=IDLE_TIMEOUT_S, startup_grace_s=0.0)
        t0 = time.perf_counter()
        plan = plan_reclaim(snap, cluster, policy, self.now)
        self.reclaim_s += time.perf_counter() - t0
        by_name = {p.name: p.pid for p in self.pods.values()}
        chosen = [by_name[n] for n in plan.deleted_pods]
        if len(chosen) != sum(quota.values()):
            raise RuntimeError(f"plan_reclaim deleted {len(chosen)} workers, the group minimums allow "
                               f"{sum(quota.values())}: {plan.decisions[:3]}")
        return chosen

    # ------------------------------------------------------------ snapshot
    def snapshot(self, with_pending: bool = True) -> Snapshot:
        b = snap(self.now, CLUSTER, namespace=NS, ids=False)
        for i, (g, c, m) in enumerate(self.cap.tolist()):
            b.node(self.node_names[i], {"cpu": c / 1000, "memory": m * MiB, "nvidia.com/gpu": g})
        for p in self.pods.values():
            res = {"cpu": p.cpu / 1000, "memory": p.mem * MiB, "nvidia.com/gpu": float(p.gpus)}
            b.ray_pod(p.name, self.node_names[p.node], requests=res, created_at_s=p.created_s, cluster=CLUSTER,
                      group=p.group)
            b.ray_node(f"ray-{p.pid:05d}", p.name, node_type=p.group, total={"GPU": float(p.gpus), "CPU": p.cpu / 1000},
                       available={"GPU": p.gpus - p.used_milli / 1000, "CPU": (p.cpu - p.used_cpu) / 1000},
                       idle_since_s=p.idle_since)
        if with_pending:
            for i, t in enumerate(self.pending):
                g, c, m = t.pod_shape()
                res = {"cpu": c / 1000, "memory": m * MiB, "nvidia.com/gpu": float(g)}
                b.ray_pod(f"{CLUSTER}-pending-{i:05d}", requests=res, created_at_s=self.now, cluster=CLUSTER,
                          group=t.group)
        return b.obj()

    def pending_templates(self) -> tuple[GroupTemplate, ...]:
        """The Pareto-minimal (GPU, CPU, memory) shapes of the Pending pods (the rest cannot change (b) or (c))."""
        shapes = sorted({t.pod_shape() for t in self.pending})
        keep: list[tuple[int, int, int]] = []
        for s in shapes:
            if not any(k[0] <= s[0] and k[1] <= s[1] and k[2] <= s[2] for k in keep):
                keep.append(s)
        return tuple(GroupTemplate(group_name=f"pending-shape-{i}",
                                   requests={"cpu": c / 1000, "memory": m * MiB, "nvidia.com/gpu": float(g)})
                     for i, (g, c, m) in enumerate(keep)) or (NO_SHAPE,)

    # ------------------------------------------------------------ metrics
    def whole_free_8(self) -> int:
        return int(np.sum((self.cap[:, 0] >= 8) & (self.used[:, 0] == 0)))

    def measure(self) -> dict[str, object]:
        t0 = time.perf_counter()
        rep = stranded_gpus(self.snapshot(), templates=self.pending_templates(), include_pending_pgs=False)
        self.stranded_s += time.perf_counter() - t0
        total = int(self.cap[:, 0].sum())
        unalloc = total - int(self.used[:, 0].sum())
        share = [p for p in self.pods.values() if p.group == "share"]
        return {
            "gpus": total,
            "unallocated_gpus": unalloc,
            "lib_free_gpus": round(rep.free_gpus, 6),
            "stranded_integer": round(rep.integer_model_gpus, 2),
            "stranded_cpu_mem": round(rep.cpu_memory_gpus, 2),
            "stranded_fragment": round(rep.fragment_gpus, 2),
            "stranded_gpus": round(rep.stranded_gpus, 2),
            "smallest_pending": rep.smallest_pending_gpus.get("nvidia.com/gpu"),
            "idle_worker_gpus": sum(p.gpus for p in self.pods.values() if p.idle_since is not None),
            "share_pods": len(share),
            "whole_free_8gpu_nodes": self.whole_free_8(),
            "pending_tasks": len(self.pending),
            "pending_gpus": round(sum(t.offered for t in self.pending), 2),
            "pending_8gpu_tasks": sum(1 for t in self.pending if t.gpus == 8),
            "running_tasks": len(self.task_pod),
            "pods": len(self.pods),
        }


def run_policy(policy: str, nodes: list[dict[str, str]], stream: list[Task], arrivals: list[Task], rounds: int,
               samples: list[float], churn: float, warm: float, seed: int) -> tuple[list[dict], list[dict]]:
    sim = Sim(policy, nodes)
    total = float(sim.cap[:, 0].sum())
    fill_rows: list[dict] = []
    offered, i = 0.0, 0
    for level in samples:
        while offered < level * total - 1e-9:
            t = stream[i % len(stream)]
            if i >= len(stream):  # cycled: a new task of the same shape
                t = Task(f"{t.name}~{i // len(stream)}", t.gpus, t.milli, t.cpu, t.mem)
            i += 1
            offered += t.offered
            sim.offer(t)
        fill_rows.append({"phase": "fill", "policy": policy, "level": level, "round": None,
                          "offered_gpus": round(offered, 1), "submitted": i, "failed": sim.failed,
                          **sim.measure()})
    churn_rows: list[dict] = []
    sim.now = T0
    nxt = 0  # position in the shared arrival sequence
    for r in range(1, rounds + 1):
        start = sim.now
        was_idle = {pid for g in GROUPS for pid in sim.idle[g]}
        leaving = sorted((unit(seed, "leave-at", r, n), n) for n in sim.task_pod if unit(seed, "leave", r, n) < churn)
        departed_gpus = 0.0
        for u, name in leaving:
            departed_gpus += sim.pods[sim.task_pod[name]].tasks[name].offered
            sim.depart(name, start + u * (ROUND_S - IDLE_TIMEOUT_S))
        sim.now = start + ROUND_S
        queued = len(sim.pending)
        retried = sim.retry_pending()  # the queue gets the freed room first (idle workers, free GPUs)
        fresh = {g: sum(1 for pid in sim.idle[g] if pid not in was_idle) for g in GROUPS}
        removed, emptied = sim.scale_down(warm, fresh)
        whole8_after_reclaim = sim.whole_free_8()
        retried += sim.retry_pending()  # and again after the scale-down (whole nodes for 8-GPU tasks)
        failed_before = sim.failed
        new, offered_new = [], 0.0
        while offered_new < departed_gpus:  # closed loop: what left comes back as new demand
            t = arrivals[nxt]  # 20,000 drawn: far more than 10 rounds use
            nxt += 1
            new.append(t)
            offered_new += t.offered
            sim.offer(t)
        placed_new = len(new) - (sim.failed - failed_before)
        churn_rows.append({"phase": "churn", "policy": policy, "level": None, "round": r,
                           "departed_tasks": len(leaving), "departed_gpus": round(departed_gpus, 1),
                           "removed_workers": removed, "nodes_emptied": emptied,
                           "whole_8gpu_after_reclaim": whole8_after_reclaim,
                           "queued_before": queued, "retried_placed": retried,
                           "arrived": len(new), "arrived_gpus": round(offered_new, 1),
                           "arrived_8gpu": sum(1 for t in new if t.gpus == 8),
                           "placed_new": placed_new, "failed": sim.failed, **sim.measure()})
    for row in fill_rows + churn_rows:
        row["reclaim_s"] = round(sim.reclaim_s, 3)
        row["stranded_s"] = round(sim.stranded_s, 3)
    return fill_rows, churn_rows
