"""Fragmentation on the openb cluster: spread vs best-fit vs best-fit + raygpu's reclaimer, as the cluster fills.

A placement simulation whose stranded-GPU numbers come from the doctor's own
arithmetic (``raygpu.plan.doctor.stranded.stranded_gpus``) and whose raygpu
scale-down choice comes from the reclaimer itself
(``raygpu.plan.reclaim.plan_reclaim``, which orders idle workers by
``_defrag_key``: removals that free whole Kubernetes nodes first). Both are
called on ``Snapshot`` / ``RayClusterView`` objects built from the simulated
state; nothing of either is re-implemented here.

What is real and what is synthesized:

* Cluster (real): the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv``
  (Alibaba clusterdata, openb, USENIX ATC '23) with their GPU count, CPU
  (``cpu_milli``) and memory (``memory_mib``) as allocatable. GPU models are
  interchangeable (``model`` / ``gpu_spec`` ignored; ``gpu_spec`` is empty in
  the default list anyway). CPU-only nodes and CPU-only tasks are left out.
  ``--quick`` keeps every 8th node.
* Tasks (real shapes): the GPU tasks of ``openb_pod_list_default.csv``
  (7,064: 3,911 whole 1-GPU, 75 whole 2/4/8-GPU, 3,078 fractional) with their
  own ``num_gpu``, ``gpu_milli``, ``cpu_milli``, ``memory_mib``.
* Mapping to Ray on Kubernetes (synthesized): one RayCluster. A whole task
  (``gpu_milli`` = 1000) runs on its own worker pod of group ``gpu<g>`` whose
  requests are the task's (g ``nvidia.com/gpu``, its CPU and memory). A
  fractional task (``num_gpu`` 1, ``gpu_milli`` < 1000) is a Ray task asking
  ``GPU = gpu_milli / 1000``; Ray packs such tasks onto worker pods of group
  ``share`` that each hold one whole ``nvidia.com/gpu`` and 12 CPUs / 48 GiB
  (1/8 of the commonest 8-GPU node; every fractional task of the trace fits
  it), choosing the share worker whose GPU is tightest after adding the task
  (and whose CPU and memory still fit); only when none fits does it ask for a
  new share pod. Kubernetes never splits a GPU: that is the integer model.
* Fill (synthesized order: the trace's ``creation_time``): the tasks are
  submitted one by one, cycled once the list is used up (only needed above
  98% in the full run), until the offered GPU demand (whole GPUs, plus
  ``gpu_milli`` / 1000 per fractional task) reaches 1.0 x the cluster's
  GPUs; measured every 5 points from 0.3. Nothing leaves while filling; a task whose pod fits no
  node fails and stays Pending (the demand the stranded arithmetic sees).
* Churn (synthesized), ``--rounds`` rounds of one simulated hour from the
  filled state: (1) each running task leaves with probability ``--churn``
  (0.2; a seeded hash of the task name and round, the same draw in every
  policy) at a time spread over the hour; a worker with no task left becomes
  an idle Ray node. (2) The Pending queue is retried in order (it may reuse
  the idle workers). (3) Scale-down: each worker group keeps warm (its
  ``minReplicas``) ``--warm`` (half) of the workers that went idle this round
  and removes every other idle worker, old or new; the policies differ only
  in which idle workers they keep. (4) The queue is retried again. (5)
  Arrivals, a closed loop: as many GPUs as left in (1) arrive as new tasks,
  taken in order from one seeded draw (the same sequence in every policy) of
  the GPU tasks of ``openb_pod_list_multigpu50.csv`` (half of their GPU
  demand is 2/4/8-GPU tasks; 556 are 8-GPU whole-node tasks), so the mix
  shifts towards training-sized tasks. A task first reuses a warm idle worker
  of its own group whose pod covers its CPU and memory, else asks a new pod;
  one that fits nowhere joins the queue.

Policies (kube-scheduler's NodeResourcesFit score over cpu, memory and
``nvidia.com/gpu``, weight 1 each, computed with the incoming pod; ties go to
the lower node index; BalancedAllocation is not modelled):

* ``spread``: LeastAllocated (kube-scheduler's default strategy); scale-down in
  Ray autoscaler v2's termination order (longest idle first, then creation
  order: ``_sort_nodes_for_termination``'s keys, all idle nodes at 0 util).
* ``best-fit``: MostAllocated (bin packing); the same Ray scale-down order.
* ``raygpu``: MostAllocated, and scale-down by ``plan_reclaim`` on a snapshot
  of the cluster with each group's ``minReplicas`` set as above.
  While filling nothing leaves, so raygpu equals best-fit there by design.

Metrics, from ``stranded_gpus(snapshot, templates=...)``: free (unallocated)
GPUs; (a) integer model: the unused rest of share workers' GPUs; (c) free
GPUs on nodes with fewer free GPUs than the smallest Pending request, checked
first; (b) free GPUs on nodes where some Pending shape's GPU count fits but no
such shape fits the free CPU or memory. A free GPU counts once. The
worker shapes given to it are those of the Pending pods; with nothing Pending a
GPU-less placeholder shape is passed (else the function falls back to running
pods' shapes), so (b) and (c) are 0: nothing waits, nothing is stranded.
Also: whole free 8-GPU nodes (no pod at all), failed / Pending tasks.

    python -m benchmarks.bench_fragmentation            # 1,213 nodes, 8 churn rounds
    python -m benchmarks.bench_fragmentation --quick    # 152 nodes, 3 churn rounds
    python -m benchmarks.bench_fragmentation --json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from benchmarks._common import OPENB, machine, machine_line, need_traces, print_table, read_csv, save_plot
from raygpu.model.raycluster import GroupTemplate
from raygpu.model.reclaim import ReclaimPolicy
from raygpu.model.views import Snapshot
from raygpu.plan.doctor.stranded import stranded_gpus
from raygpu.plan.reclaim import plan_reclaim
from raygpu.testing.builders import cluster_view, snap

MiB = 2**20
POLICIES = ("spread", "best-fit", "raygpu")
NODES_CSV = OPENB / "openb_node_list_gpu_node.csv"
TASKS_CSV = OPENB / "openb_pod_list_default.csv"
ARRIVALS_CSV = OPENB / "openb_pod_list_multigpu50.csv"
SHARE_CPU_M, SHARE_MEM_MIB = 12_000, 48 * 1024  # one share worker: 1 GPU, 12 CPUs, 48 GiB
GROUPS = ("gpu1", "gpu2", "gpu4", "gpu8", "share")
CLUSTER, NS = "openb", "default"
ROUND_S = 3600.0
IDLE_TIMEOUT_S = 300.0
T0 = 1_000_000.0  # simulated clock at the start of the churn phase
LEVELS = (0.6, 0.8, 0.9, 0.95, 1.0)
SAMPLE_STEP = 0.05
NO_SHAPE = GroupTemplate(group_name="no-pending-work", requests={"cpu": 0.0})  # a GPU-less shape: (b) off


@dataclass(frozen=True)
class Task:
    name: str
    gpus: int
    milli: int  # gpu_milli per GPU
    cpu: int  # milli-CPU
    mem: int  # MiB

    @property
    def frac(self) -> bool:
        return self.gpus == 1 and self.milli < 1000

    @property
    def offered(self) -> float:
        return self.milli / 1000 if self.frac else float(self.gpus)

    @property
    def group(self) -> str:
        return "share" if self.frac else f"gpu{self.gpus}"

    def pod_shape(self) -> tuple[int, int, int]:
        """(GPUs, milli-CPU, MiB) of the pod this task needs when no existing worker takes it."""
        return (1, SHARE_CPU_M, SHARE_MEM_MIB) if self.frac else (self.gpus, self.cpu, self.mem)


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


def read_tasks(path, prefix: str) -> list[Task]:
    out = []
    for r in read_csv(path):
        if int(r["num_gpu"]) >= 1:
            out.append(Task(f"{prefix}{r['name']}", int(r["num_gpu"]), int(r["gpu_milli"]), int(r["cpu_milli"]),
                            int(r["memory_mib"])))
    return out


def fill_stream() -> list[Task]:
    """The default list's GPU tasks in creation order (the file's order: creation_time is sorted)."""
    rows = read_csv(TASKS_CSV)
    rows.sort(key=lambda r: (float(r["creation_time"]), r["name"]))
    return [Task(r["name"], int(r["num_gpu"]), int(r["gpu_milli"]), int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in rows if int(r["num_gpu"]) >= 1]


def unit(*parts: object) -> float:
    """A deterministic uniform draw in [0, 1) from a hash of ``parts`` (same in every policy)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) / 2**32


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


def draw_arrivals(pool: list[Task], n: int, seed: int) -> list[Task]:
    """One seeded sequence of ``n`` arrivals drawn from ``pool``, consumed in order by every policy."""
    rnd = random.Random(seed)
    return [Task(f"new-{i:05d}-{t.name}", t.gpus, t.milli, t.cpu, t.mem)
            for i, t in enumerate(rnd.choice(pool) for _ in range(n))]


def plot(fill: dict[str, list[dict]], churn: dict[str, list[dict]], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    color = {"spread": "tab:blue", "best-fit": "tab:orange", "raygpu": "tab:green"}
    ls = {"spread": "-", "best-fit": "-", "raygpu": "--"}  # raygpu = best-fit while filling: drawn dashed on top
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    for row, data, xkey, xlabel in ((0, fill, None, "offered GPU demand / cluster GPUs (fill)"),
                                    (1, churn, "round", "churn round")):
        for pol, rows in data.items():
            x = [r["offered_gpus"] / r["gpus"] for r in rows] if xkey is None else [r[xkey] for r in rows]
            kw = dict(color=color[pol], ls=ls[pol], marker=".")
            ax[row, 0].plot(x, [r["unallocated_gpus"] for r in rows], label=f"{pol}: unallocated", **kw)
            ax[row, 0].plot(x, [r["stranded_cpu_mem"] + r["stranded_fragment"] for r in rows],
                            label=f"{pol}: of which stranded (b)+(c)", color=color[pol], ls=":", marker="x", alpha=0.8)
            ax[row, 1].plot(x, [r["pending_gpus"] for r in rows], label=f"{pol}: GPUs of Pending tasks", **kw)
            ax[row, 1].plot(x, [r["stranded_integer"] for r in rows], label=f"{pol}: (a) integer model",
                            color=color[pol], ls=":", marker="x", alpha=0.8)
            key = "whole_free_8gpu_nodes" if row == 0 else "whole_8gpu_after_reclaim"
            ax[row, 2].plot(x, [r[key] for r in rows], label=pol, **kw)
            if row == 1:
                ax[row, 2].plot(x, [r["nodes_emptied"] for r in rows], label=f"{pol}: nodes emptied by scale-down",
                                color=color[pol], ls=":", marker="x", alpha=0.8)
        for a in ax[row]:
            a.set_xlabel(xlabel)
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
            if row == 1:
                a.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax[row, 0].set_ylabel("GPUs")
        ax[row, 1].set_ylabel("GPUs")
    ax[0, 2].set_ylabel("whole free 8-GPU nodes")
    ax[1, 2].set_ylabel("nodes (free 8-GPU ones: after scale-down)")
    fig.suptitle(title, fontsize=9)
    return save_plot(fig, name)


FILL_COLS = [("policy", "policy", ""), ("level", "fill", ".0%"), ("submitted", "tasks", "d"),
             ("failed", "failed", "d"), ("pending_gpus", "failed GPUs", ".0f"),
             ("pending_8gpu_tasks", "failed 8-GPU", "d"), ("unallocated_gpus", "unalloc GPUs", "d"),
             ("stranded_integer", "(a) integer", ".1f"), ("stranded_cpu_mem", "(b) cpu/mem", ".1f"),
             ("stranded_fragment", "(c) fragment", ".1f"), ("smallest_pending", "min pending", ".0f"),
             ("whole_free_8gpu_nodes", "free 8-GPU nodes", "d"), ("share_pods", "share pods", "d")]
CHURN_COLS = [("policy", "policy", ""), ("round", "round", "d"), ("departed_gpus", "left GPUs", ".0f"),
              ("removed_workers", "removed", "d"), ("nodes_emptied", "nodes emptied", "d"),
              ("whole_8gpu_after_reclaim", "free 8-GPU nodes", "d"), ("retried_placed", "queue placed", "d"),
              ("arrived", "arrived", "d"), ("arrived_8gpu", "arrived 8-GPU", "d"), ("placed_new", "placed", "d"),
              ("pending_tasks", "pending", "d"), ("pending_8gpu_tasks", "pending 8-GPU", "d"),
              ("unallocated_gpus", "unalloc GPUs", "d"), ("idle_worker_gpus", "warm GPUs", "d"),
              ("stranded_integer", "(a)", ".1f"), ("stranded_cpu_mem", "(b)", ".1f"), ("stranded_fragment", "(c)", ".1f"),
              ("smallest_pending", "min pending", ".0f")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="every 8th node, 3 churn rounds")
    ap.add_argument("--rounds", type=int, default=None, help="churn rounds (default 8; quick 3)")
    ap.add_argument("--churn", type=float, default=0.2,
                    help="per round: probability that a running task leaves (as many GPUs arrive as left)")
    ap.add_argument("--warm", type=float, default=0.5, help="share of each group's idle workers kept warm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if not need_traces(NODES_CSV, TASKS_CSV, ARRIVALS_CSV):
        return 0
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 8)
    all_nodes = read_csv(NODES_CSV)
    nodes = all_nodes[::8] if args.quick else all_nodes
    gpus = sum(int(r["gpu"]) for r in nodes)
    stream = fill_stream()
    samples = sorted({round(0.3 + SAMPLE_STEP * k, 4) for k in range(int(round(0.7 / SAMPLE_STEP)) + 1)} | set(LEVELS))
    arrivals = draw_arrivals(read_tasks(ARRIVALS_CSV, "m50-"), 20_000, args.seed)
    t0 = time.perf_counter()
    fill, churn = {}, {}
    for pol in POLICIES:
        fill[pol], churn[pol] = run_policy(pol, nodes, stream, arrivals, rounds, samples, args.churn, args.warm, args.seed)
    elapsed = time.perf_counter() - t0
    rows = [r for pol in POLICIES for r in fill[pol] if r["level"] in LEVELS] + \
           [r for pol in POLICIES for r in churn[pol]]
    plots = []
    if not args.no_plot:
        plots.append(plot(fill, churn, "fragmentation_quick.png" if args.quick else "fragmentation.png",
                          f"openb cluster ({len(nodes)} nodes, {gpus} GPUs): fill with openb default tasks, then "
                          f"{rounds} churn rounds ({args.churn:.0%} leave, multigpu50 arrivals, "
                          f"{args.warm:.0%} of idle workers kept warm)"))
    result = {
        "benchmark": "fragmentation", "machine": machine(), "quick": args.quick,
        "data": {"nodes": NODES_CSV.name, "fill_tasks": TASKS_CSV.name, "arrivals": ARRIVALS_CSV.name,
                 "synthesized": "task order (creation_time, cycled), Ray share workers for fractional tasks, "
                                "churn departures, arrival draw, warm pool"},
        "cluster": {"nodes": len(nodes), "gpus": gpus, "nodes_8gpu": sum(1 for r in nodes if int(r["gpu"]) >= 8)},
        "params": {"levels": list(LEVELS), "samples": samples, "rounds": rounds, "churn": args.churn,
                   "warm": args.warm, "seed": args.seed, "share_worker": {"gpu": 1, "cpu": SHARE_CPU_M / 1000,
                                                                           "memory_gib": SHARE_MEM_MIB / 1024},
                   "idle_timeout_s": IDLE_TIMEOUT_S, "round_s": ROUND_S},
        "elapsed_s": round(elapsed, 2), "plots": plots, "rows": rows,
        "samples": {pol: [{k: r[k] for k in ("level", "offered_gpus", "unallocated_gpus", "stranded_gpus",
                                             "whole_free_8gpu_nodes", "failed")} for r in fill[pol]]
                    for pol in POLICIES},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"fragmentation: openb cluster {len(nodes)} nodes / {gpus} GPUs; fill with {TASKS_CSV.name} tasks in "
          f"creation order; {rounds} churn rounds ({args.churn:.0%} leave, {ARRIVALS_CSV.name} arrivals, "
          f"{args.warm:.0%} of idle workers warm), seed {args.seed}")
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    print("\nfill (nothing leaves; raygpu = best-fit here by design):")
    print_table([r for r in rows if r["phase"] == "fill"], FILL_COLS)
    print("\nchurn (after each round's departures, scale-down and arrivals):")
    print_table([r for r in rows if r["phase"] == "churn"], CHURN_COLS)
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
