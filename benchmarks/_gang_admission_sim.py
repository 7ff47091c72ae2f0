"""The gang-admission replay's model: trace loading, jobs, and the event simulation of the first three policies.

Policies ``pods`` and ``raycluster-gang`` place pods as plain KubeRay / a
per-RayCluster gang would; ``raygpu`` plans each gang with
``raygpu.plan.gang.reservation.plan_gang`` when it arrives, giving it the free GPUs per
node at that moment (``free=``: its pool's nodes only), and admits its pods
all-or-nothing. In every policy a gang goes only to its node pool's nodes
(``Job.pool``, ``benchmarks._gang_admission_pools``); singles anywhere. The
fourth policy (``raygpu+guard``) is ``benchmarks._gang_admission_guard``; the
fifth (``scale-up``: unmodified jobs, the sidecar makes the same reservation
after a reaction delay, at most 4 in flight per pool, oldest first) is
``benchmarks._gang_admission_scale_up``; the reserving peers (``easy-backfill``,
``volcano-reserve``, ``kueue-strictfifo``) are ``benchmarks._gang_admission_peers``.
``Sim.on_arrive``, ``Sim.on_end`` and ``Sim.on_other_event`` are their hooks; ``packing``
picks the node choice (first fit, or MostAllocated on GPUs) for every policy.
Simulated seconds, not timings.
"""

from __future__ import annotations

import heapq
import math
import random
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from benchmarks._common import OPENB, percentile, read_csv
from benchmarks._gang_admission_pools import ANYWHERE, PoolMasks, gang_pool
from raygpu.model.gang import GangRequest, NodeFree
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang.reservation import plan_gang
from raygpu.testing.builders import cluster_view

GiB = 2**30
POLICIES = ("pods", "raycluster-gang", "raygpu", "raygpu+guard", "scale-up", "easy-backfill", "volcano-reserve",
            "kueue-strictfifo")
RESERVING = ("raygpu+guard", "easy-backfill", "volcano-reserve", "kueue-strictfifo")  # hold order or nodes for a gang
RAYGPU_POLICIES = ("raygpu", "raygpu+guard", "guard-proposal")  # gangs shaped by plan_gang
NODES_CSV = OPENB / "openb_node_list_gpu_node.csv"
TASKS_CSV = OPENB / "openb_pod_list_default.csv"
GANG_SIZES = (2, 4, 8)
MAX_DUR_S = 4 * 3600.0


@dataclass
class Job:
    jid: int
    name: str
    arrive: float
    dur: float
    k: int  # pods as the trace task is split (1 for singles)
    g: int  # GPUs per pod
    gang: bool
    pods: list[int] = field(default_factory=list)  # GPUs of each pod still to place (policy-specific)
    gate: int = 0  # pods to admit all-or-nothing first (raycluster-gang), 0 when done
    placed: list[tuple[int, int]] = field(default_factory=list)  # (node, gpus)
    held_since: float | None = None
    start: float | None = None
    retries: int = 0
    queued: float = 0.0  # when it (re)joined the queue: seniority for the guard's election
    pool: int = ANYWHERE  # node pool a gang is pinned to (benchmarks._gang_admission_pools); singles: anywhere


def load_cluster(quick: bool) -> np.ndarray:
    nodes = read_csv(NODES_CSV)
    gpus = [int(r["gpu"]) for r in nodes]
    return np.array(gpus[::8] if quick else gpus, dtype=np.int64)


def load_tasks() -> list[tuple[str, int, float]]:
    """(name, num_gpu, duration_s) of the GPU tasks that ran, in creation order."""
    out = []
    for r in sorted(read_csv(TASKS_CSV), key=lambda r: (float(r["creation_time"]), r["name"])):
        if int(r["num_gpu"]) < 1 or not r["scheduled_time"] or not r["deletion_time"]:
            continue
        dur = float(r["deletion_time"]) - float(r["scheduled_time"])
        out.append((r["name"], int(r["num_gpu"]), min(max(dur, 60.0), MAX_DUR_S)))
    return out


def make_jobs(n_jobs: int, cluster_gpus: int, load: float, seed: int, gang_share: float,
              n_pools: int = 1) -> list[Job]:
    """The replay's jobs; each gang pinned to pool ``crc32(name) % n_pools`` (the draws do not depend on it)."""
    tasks = load_tasks()
    multi = [t for t in tasks if t[1] > 1]
    single = [t for t in tasks if t[1] == 1]
    rnd = random.Random(seed)
    shapes, used = [], {"m": 0, "s": 0}
    for i in range(n_jobs):
        if rnd.random() < gang_share:  # next multi-GPU task of the trace (cycled)
            name, g, dur = multi[used["m"] % len(multi)]
            used["m"] += 1
            k = GANG_SIZES[zlib.crc32(name.encode()) % 3]
        else:  # next single-GPU task of the trace (cycled)
            name, g, dur = single[used["s"] % len(single)]
            used["s"] += 1
            k = 1
        shapes.append((f"{name}-{i}", k, g, dur))
    mean_work = sum(k * g * d for _, k, g, d in shapes) / len(shapes)  # GPU-seconds per job
    rate = load * cluster_gpus / mean_work  # jobs per second
    t, jobs = 0.0, []
    for i, (name, k, g, dur) in enumerate(shapes):
        t += rnd.expovariate(rate)
        jobs.append(Job(i, name, t, dur, k, g, gang=k > 1, queued=t,
                        pool=gang_pool(name, n_pools) if k > 1 else ANYWHERE))
    return jobs


def raygpu_cluster() -> RayClusterView:
    view = cluster_view("jobs", autoscaling_enabled=True).head("head", limits={"cpu": 4, "memory": 16 * GiB})
    for n in (1, 2, 4, 8):
        res = {"cpu": 8 * n, "memory": 64 * n * GiB, "nvidia.com/gpu": n}
        view.group(f"gpu{n}", max_replicas=10_000, limits=res, requests=dict(res))
    return view.obj()


def first_fit(free: np.ndarray, g: int, score: np.ndarray | None = None) -> int:
    """The node for a pod of ``g`` GPUs: the first that fits, or (``score``: lower first) the best-scored."""
    idx = np.flatnonzero(free >= g)
    if not idx.size:
        return -1
    return int(idx[0]) if score is None else int(idx[np.argmin(score[idx])])


def fit_all(free: np.ndarray, pods: list[int], cap: np.ndarray | None = None) -> list[int] | None:
    """Nodes for all ``pods`` (largest first) on a copy of ``free``, or None. ``cap`` (GPUs per node): choose
    by kube-scheduler's ``MostAllocated`` on GPUs (the most allocated fraction first, counting the pods
    placed so far), else first fit in node order."""
    trial = free.copy()
    where = [0] * len(pods)
    for i in sorted(range(len(pods)), key=lambda i: -pods[i]):
        n = first_fit(trial, pods[i], None if cap is None else trial / cap)
        if n < 0:
            return None
        trial[n] -= pods[i]
        where[i] = n
    return where


PACKING = ("first-fit", "most-allocated")


class Sim:
    def __init__(self, policy: str, free: np.ndarray, jobs: list[Job], give_up_s: float,
                 pools: np.ndarray | None = None, packing: str = "first-fit") -> None:
        if packing not in PACKING:
            raise ValueError(f"packing must be one of {PACKING}, got {packing!r}")
        self.packing = packing
        self.policy, self.free, self.total = policy, free.copy(), int(free.sum())
        self.pools = PoolMasks(np.zeros(len(free), dtype=np.int64) if pools is None else pools)
        self.jobs, self.give_up_s = jobs, give_up_s
        self.running_held = np.zeros_like(free)  # GPUs of running jobs, per node
        self.running: dict[int, float] = {}  # jid -> end time
        self.waiting: list[Job] = []
        self.events: list[tuple[float, int, int, int]] = []  # (t, kind, seq, jid); kind 0 end, 1 arrive, 2 give-up check
        self.seq = 0
        self.now = 0.0
        self.partial_gpu_s = 0.0
        self.deadlocks = 0
        self.deadlock_s = 0.0
        self.in_deadlock = False
        self.gave_up = 0
        self.alloc_samples: list[tuple[float, float, float]] = []  # (t, allocated frac, running frac)
        self.plan_calls = 0
        self.plan_s = 0.0
        self.cap = free.copy()  # GPUs per node
        self.shapes: dict[int, int] = {}  # GPUs per pod chosen by plan_gang -> gangs
        self.cluster = raygpu_cluster() if policy in RAYGPU_POLICIES else None
        for j in jobs:
            if policy in RAYGPU_POLICIES and j.gang:
                j.pods = []  # planned on arrival, against the free GPUs of that moment
            else:
                j.pods = [j.g] * j.k
                j.gate = math.ceil(j.k / 2) if (policy == "raycluster-gang" and j.gang) else 0
            self.push(j.arrive, 1, j.jid)

    def score(self) -> np.ndarray | None:
        """fit_all's ``cap`` for the packing profile: GPUs per node under MostAllocated, None for first fit."""
        return self.cap if self.packing == "most-allocated" else None

    def avail(self, j: Job, per_node: np.ndarray | None = None) -> np.ndarray:
        """``per_node`` (default: the free GPUs) where ``j`` may go: 0 outside a pinned gang's pool."""
        return self.pools.only(j.pool, self.free if per_node is None else per_node)

    def free_view(self, pool: int = ANYWHERE) -> tuple[NodeFree, ...]:
        """What each node (of ``pool``) can bind now, as plan_gang reads it (nodes of one (free, total) shape given once)."""
        big = {"cpu": 1e9, "memory": 1e18}  # CPU and memory are not modelled
        shapes: dict[tuple[int, int], int] = {}
        mask = self.pools.nodes(pool)
        free, cap = (self.free, self.cap) if mask is None else (self.free[mask], self.cap[mask])
        for f, c in zip(free.tolist(), cap.tolist()):
            shapes[f, c] = shapes.get((f, c), 0) + 1
        return tuple(NodeFree(free={"nvidia.com/gpu": f, **big}, allocatable={"nvidia.com/gpu": c, **big}, count=n)
                     for (f, c), n in sorted(shapes.items()))

    def plan(self, j: Job) -> None:
        """plan_gang for gang ``j`` now: its pods (GPUs each), admitted all-or-nothing."""
        req = GangRequest(name=j.name, cluster="jobs", bundles=[{"GPU": float(j.g)}] * j.k, strategy="PACK")
        t0 = time.perf_counter()
        plan = plan_gang(req, self.cluster, free=self.free_view(j.pool))  # its RayCluster sees its pool only
        self.plan_s += time.perf_counter() - t0
        self.plan_calls += 1
        size = int(plan.need.k8s_requests["nvidia.com/gpu"])
        j.pods = [size] * plan.pod_count
        j.gate = len(j.pods)
        self.shapes[size] = self.shapes.get(size, 0) + 1

    def account(self, dt: float) -> None:
        """Integrate the held-GPU metrics over ``dt`` seconds of the current state."""
        self.partial_gpu_s += dt * self.partial_held()

    def on_arrive(self, j: Job) -> None:
        """Job ``j`` is submitted: its pods join the queue (a raygpu gang's planned first)."""
        if self.policy in RAYGPU_POLICIES and j.gang:
            self.plan(j)
        self.waiting.append(j)

    def on_other_event(self, kind: int, j: Job) -> bool:
        """Events of a subclass (kind >= 3); True when the state changed."""
        return False

    def on_end(self, j: Job) -> None:
        """Job ``j`` has ended (its GPUs are free again): a subclass's hook."""

    def extra_metrics(self) -> dict[str, object]:
        return {"held_idle_gpu_h": 0.0, "hold_timeouts": 0}

    def push(self, t: float, kind: int, jid: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, jid))

    def partial_held(self) -> int:
        return sum(g for j in self.waiting for _, g in j.placed)

    def place(self, j: Job, i: int, n: int) -> None:
        g = j.pods.pop(i)
        self.free[n] -= g
        j.placed.append((n, g))
        if j.held_since is None:
            j.held_since = self.now
            self.push(self.now + self.give_up_s, 2, j.jid)

    def schedule(self) -> None:
        still = []
        for j in self.waiting:
            if self.free.max() <= 0:
                still.append(j)
                continue
            if j.gate:  # all-or-nothing part
                where = fit_all(self.avail(j), j.pods[: j.gate], self.score())
                if where is not None:
                    for n in where:
                        self.place(j, 0, n)
                    j.gate = 0
            if not j.gate:
                while j.pods:
                    n = first_fit(self.avail(j), j.pods[0], None if self.score() is None else self.free / self.cap)
                    if n < 0:
                        break
                    self.place(j, 0, n)
            if j.pods:
                still.append(j)
            else:
                self.start(j)
        self.waiting = still

    def start(self, j: Job) -> None:
        j.start = self.now
        for n, g in j.placed:
            self.running_held[n] += g
        self.running[j.jid] = self.now + j.dur
        self.push(self.now + j.dur, 0, j.jid)

    def deadlocked(self) -> bool:
        if not any(j.placed for j in self.waiting):
            return False
        avail = self.free + self.running_held  # every running job finished; partial holdings stay
        return not any(fit_all(self.avail(j, avail), j.pods) is not None for j in self.waiting)

    def run(self) -> dict[str, object]:
        last_t = 0.0
        next_sample = 0.0
        horizon = self.jobs[-1].arrive
        step = horizon / 400
        while self.events:
            t, kind, _, jid = heapq.heappop(self.events)
            dt = t - last_t
            self.account(dt)
            if self.in_deadlock:
                self.deadlock_s += dt
            while next_sample <= t:
                alloc = self.total - int(self.free.sum())
                self.alloc_samples.append((next_sample, alloc / self.total, int(self.running_held.sum()) / self.total))
                next_sample += step
            last_t = self.now = t
            j = self.jobs[jid]
            if kind == 0:  # job ends
                del self.running[jid]
                for n, g in j.placed:
                    self.free[n] += g
                    self.running_held[n] -= g
                self.on_end(j)
            elif kind == 1:
                self.on_arrive(j)
            elif kind == 2:  # give-up check
                if j.start is None and j.held_since is not None and t - j.held_since >= self.give_up_s - 1e-6:
                    for n, g in j.placed:
                        self.free[n] += g
                        j.pods.append(g)
                    j.placed = []
                    j.held_since = None
                    if self.policy == "raycluster-gang" and j.gang:
                        j.gate = math.ceil(j.k / 2) if len(j.pods) == j.k else 0
                    if self.policy in RAYGPU_POLICIES and j.gang:
                        j.gate = len(j.pods)
                    j.retries += 1
                    self.gave_up += 1
                    self.waiting.remove(j)
                    self.waiting.append(j)  # resubmitted at the back
                    j.queued = t
                else:
                    continue
            elif not self.on_other_event(kind, j):
                continue
            self.schedule()
            dl = self.deadlocked()
            if dl and not self.in_deadlock:
                self.deadlocks += 1
            self.in_deadlock = dl
        gangs = [j for j in self.jobs if j.gang]
        gang_waits = [j.start - j.arrive for j in gangs if j.start is not None]
        single_waits = [j.start - j.arrive for j in self.jobs if not j.gang and j.start is not None]
        run_frac = [s[2] for s in self.alloc_samples if s[0] <= horizon]
        return {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "gangs": len(gangs),
            "unfinished": sum(1 for j in self.jobs if j.start is None),
            "partial_gpu_h": round(self.partial_gpu_s / 3600, 1),
            "deadlocks": self.deadlocks,
            "deadlock_h": round(self.deadlock_s / 3600, 2),
            "gave_up": self.gave_up,
            "gang_wait_p50_s": round(percentile(gang_waits, 50), 1),
            "gang_wait_p95_s": round(percentile(gang_waits, 95), 1),
            "gang_wait_p99_s": round(percentile(gang_waits, 99), 1),
            "single_wait_p50_s": round(percentile(single_waits, 50), 1),
            "single_wait_p95_s": round(percentile(single_waits, 95), 1),
            "mean_running_gpu_frac": round(sum(run_frac) / max(1, len(run_frac)), 3),
            "makespan_h": round(self.now / 3600, 2),
            "plan_gang_calls": self.plan_calls,
            "plan_gang_ms_mean": round(self.plan_s * 1e3 / self.plan_calls, 2) if self.plan_calls else None,
            "gang_pod_gpus": {str(k): v for k, v in sorted(self.shapes.items())},
            **self.extra_metrics(),
        }


