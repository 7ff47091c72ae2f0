"""Gang admission on the openb cluster shape: pods one by one vs a gang per RayCluster vs raygpu's gang per PG.

A discrete-event replay; everything but the cluster shape and the task list is
synthesized here, and said so:

* Cluster: the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv`` (Alibaba
  clusterdata, openb, USENIX ATC '23), GPU count only. GPU models are treated
  as interchangeable (``gpu_spec`` is ignored), CPU and memory are not
  modelled, the CPU-only nodes of ``openb_node_list_all_node.csv`` are left out.
  ``--quick`` keeps every 8th node.
* Jobs: the GPU tasks of ``openb_pod_list_default.csv`` that ran (have
  ``scheduled_time`` and ``deletion_time``), in ``creation_time`` order. Each
  job is, with probability ``--gang-share`` (seeded), the next multi-GPU task
  (74 in the trace, cycled), else the next single-GPU task (cycled): the trace
  has too few multi-GPU tasks (1%) to contend. Duration = deletion - scheduled, clamped to
  [60 s, 4 h]. Arrivals are Poisson (seed ``--seed``) at the rate that offers
  ``--load`` x the cluster's GPUs (the trace's own arrivals span 150 days and
  would never contend).
* A task with ``num_gpu`` = 1 (whole or fractional: a fractional task asks one
  whole ``nvidia.com/gpu``) is a single pod, placed one by one in every policy.
* A task with ``num_gpu`` = g > 1 is a gang of k pods of g GPUs each: a Ray job
  with a placement group of k bundles ``{"GPU": g}`` (PACK) that starts only
  when all k are placed. k = 2, 4 or 8, from the task's name (crc32 % 3), so
  gangs ask 4..64 GPUs.

Policies (placement is first-fit over nodes in trace order, FIFO over jobs):

* ``pods``: plain KubeRay + kube-scheduler: each of the k pods is placed as
  soon as it fits and holds its GPUs while the rest wait.
* ``raycluster-gang``: KubeRay's batch-scheduler integrations (Volcano /
  scheduler-plugins / Kueue) gang the RayCluster's min size: ceil(k/2) pods
  (minReplicas) admitted all-or-nothing; the other pods come from the Ray
  autoscaler and are placed one by one.
* ``raygpu``: ``raygpu.plan.gang.plan_gang`` turns each PG into pods of a
  RayCluster with 1/2/4/8-GPU worker groups (its own choice of template and
  packing), and the pods are admitted all-or-nothing.

A gang that has held pods for ``--give-up-s`` (1 h) without starting gives
them back and is resubmitted at the back of the queue (a RayJob deadline plus
a retry); without it the ``pods`` policy would stay deadlocked for ever.
Deadlock: a moment where some waiting gang holds pods and no waiting job
could complete even if every running job finished (only preemption helps).
Metrics: GPU-hours held by partially placed gangs, deadlock episodes and
hours, gang wait p50/p95 (arrival to start), GPU allocation over time (plot).

    python -m benchmarks.bench_gang_admission            # 1,213 nodes, 6,000 jobs, 20% gangs
    python -m benchmarks.bench_gang_admission --quick    # 152 nodes, 1,200 jobs, 20% gangs
    python -m benchmarks.bench_gang_admission --json
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from benchmarks._common import OPENB, machine, machine_line, need_traces, percentile, print_table, read_csv, save_plot
from raygpu.model.gang import GangRequest
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang import plan_gang
from raygpu.testing.builders import cluster_view

GiB = 2**30
POLICIES = ("pods", "raycluster-gang", "raygpu")
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


def make_jobs(n_jobs: int, cluster_gpus: int, load: float, seed: int, gang_share: float) -> list[Job]:
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
        jobs.append(Job(i, name, t, dur, k, g, gang=k > 1))
    return jobs


def raygpu_cluster() -> RayClusterView:
    view = cluster_view("jobs", autoscaling_enabled=True).head("head", limits={"cpu": 4, "memory": 16 * GiB})
    for n in (1, 2, 4, 8):
        res = {"cpu": 8 * n, "memory": 64 * n * GiB, "nvidia.com/gpu": n}
        view.group(f"gpu{n}", max_replicas=10_000, limits=res, requests=dict(res))
    return view.obj()


def first_fit(free: np.ndarray, g: int) -> int:
    idx = np.flatnonzero(free >= g)
    return int(idx[0]) if idx.size else -1


def fit_all(free: np.ndarray, pods: list[int]) -> list[int] | None:
    """Nodes for all ``pods`` (largest first) on a copy of ``free``, or None."""
    trial = free.copy()
    where = [0] * len(pods)
    for i in sorted(range(len(pods)), key=lambda i: -pods[i]):
        n = first_fit(trial, pods[i])
        if n < 0:
            return None
        trial[n] -= pods[i]
        where[i] = n
    return where


class Sim:
    def __init__(self, policy: str, free: np.ndarray, jobs: list[Job], give_up_s: float) -> None:
        self.policy, self.free, self.total = policy, free.copy(), int(free.sum())
        self.jobs, self.give_up_s = jobs, give_up_s
        self.running_held = np.zeros_like(free)  # GPUs of running jobs, per node
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
        cluster = raygpu_cluster() if policy == "raygpu" else None
        for j in jobs:
            if policy == "raygpu" and j.gang:
                req = GangRequest(name=j.name, cluster="jobs", bundles=[{"GPU": float(j.g)}] * j.k, strategy="PACK")
                t0 = time.perf_counter()
                plan = plan_gang(req, cluster)
                self.plan_s += time.perf_counter() - t0
                self.plan_calls += 1
                j.pods = [int(plan.need.k8s_requests["nvidia.com/gpu"])] * plan.pod_count
                j.gate = len(j.pods)
            else:
                j.pods = [j.g] * j.k
                j.gate = math.ceil(j.k / 2) if (policy == "raycluster-gang" and j.gang) else 0
            self.push(j.arrive, 1, j.jid)

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
                where = fit_all(self.free, j.pods[: j.gate])
                if where is not None:
                    for n in where:
                        self.place(j, 0, n)
                    j.gate = 0
            if not j.gate:
                while j.pods:
                    n = first_fit(self.free, j.pods[0])
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
        self.push(self.now + j.dur, 0, j.jid)

    def deadlocked(self) -> bool:
        if not any(j.placed for j in self.waiting):
            return False
        avail = self.free + self.running_held  # every running job finished; partial holdings stay
        return not any(fit_all(avail, j.pods) is not None for j in self.waiting)

    def run(self) -> dict[str, object]:
        last_t = 0.0
        next_sample = 0.0
        horizon = self.jobs[-1].arrive
        step = horizon / 400
        while self.events:
            t, kind, _, jid = heapq.heappop(self.events)
            dt = t - last_t
            held = self.partial_held()
            self.partial_gpu_s += dt * held
            if self.in_deadlock:
                self.deadlock_s += dt
            while next_sample <= t:
                alloc = self.total - int(self.free.sum())
                self.alloc_samples.append((next_sample, alloc / self.total, int(self.running_held.sum()) / self.total))
                next_sample += step
            last_t = self.now = t
            j = self.jobs[jid]
            if kind == 0:  # job ends
                for n, g in j.placed:
                    self.free[n] += g
                    self.running_held[n] -= g
            elif kind == 1:
                self.waiting.append(j)
            elif kind == 2:  # give-up check
                if j.start is None and j.held_since is not None and t - j.held_since >= self.give_up_s - 1e-6:
                    for n, g in j.placed:
                        self.free[n] += g
                        j.pods.append(g)
                    j.placed = []
                    j.held_since = None
                    if self.policy == "raycluster-gang" and j.gang:
                        j.gate = math.ceil(j.k / 2) if len(j.pods) == j.k else 0
                    if self.policy == "raygpu" and j.gang:
                        j.gate = len(j.pods)
                    j.retries += 1
                    self.gave_up += 1
                    self.waiting.remove(j)
                    self.waiting.append(j)  # resubmitted at the back
                else:
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
            "single_wait_p50_s": round(percentile(single_waits, 50), 1),
            "single_wait_p95_s": round(percentile(single_waits, 95), 1),
            "mean_running_gpu_frac": round(sum(run_frac) / max(1, len(run_frac)), 3),
            "makespan_h": round(self.now / 3600, 2),
            "plan_gang_calls": self.plan_calls,
            "plan_gang_ms_mean": round(self.plan_s * 1e3 / self.plan_calls, 2) if self.plan_calls else None,
        }


def plot(samples: dict[str, list[tuple[float, float, float]]], path_name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for pol, s in samples.items():
        t = [x[0] / 3600 for x in s]
        axes[0].plot(t, [x[1] for x in s], label=pol, lw=1)
        axes[1].plot(t, [x[2] for x in s], label=pol, lw=1)
    axes[0].set_ylabel("GPUs allocated to pods")
    axes[1].set_ylabel("GPUs used by running jobs")
    axes[1].set_xlabel("hours")
    for a in axes:
        a.set_ylim(0, 1.02)
        a.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    axes[0].set_title(title, fontsize=9)
    return save_plot(fig, path_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="every 8th node, 1,200 jobs")
    ap.add_argument("--jobs", type=int, default=None, help="jobs to replay per run (default 6,000; quick 1,200)")
    ap.add_argument("--load", type=float, default=1.1, help="offered GPU load as a fraction of the cluster")
    ap.add_argument("--give-up-s", type=float, default=3600.0, help="a gang holding pods this long without starting gives up")
    ap.add_argument("--gang-share", type=float, nargs="+", default=None,
                    help="fraction(s) of jobs drawn from the multi-GPU tasks (default 0.2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if not need_traces(NODES_CSV, TASKS_CSV):
        return 0
    n_jobs = args.jobs or (1200 if args.quick else 6_000)
    shares = args.gang_share or ([0.2])
    free = load_cluster(args.quick)
    rows, plots = [], []
    t0 = time.perf_counter()
    for share in shares:
        samples = {}
        for pol in POLICIES:
            jobs = make_jobs(n_jobs, int(free.sum()), args.load, args.seed, share)
            sim = Sim(pol, free, jobs, args.give_up_s)
            rows.append({"gang_share": share, **sim.run()})
            samples[pol] = sim.alloc_samples
        if not args.no_plot:
            suffix = "_quick" if args.quick else ""
            plots.append(plot(samples, f"gang_admission_allocation_share{int(share * 100)}{suffix}.png",
                              f"openb cluster ({len(free)} nodes, {int(free.sum())} GPUs), {n_jobs} jobs, "
                              f"{share:.0%} gangs, offered load {args.load}"))
    elapsed = time.perf_counter() - t0
    result = {"benchmark": "gang_admission", "machine": machine(), "quick": args.quick,
              "data": {"nodes": str(NODES_CSV.name), "tasks": str(TASKS_CSV.name), "synthesized": "gangs, arrivals"},
              "cluster": {"nodes": int(len(free)), "gpus": int(free.sum())},
              "params": {"jobs": n_jobs, "load": args.load, "gang_shares": shares, "give_up_s": args.give_up_s,
                         "seed": args.seed},
              "elapsed_s": round(elapsed, 2), "plots": plots, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"gang admission replay: openb cluster {len(free)} nodes / {int(free.sum())} GPUs, {n_jobs} jobs per run, "
          f"offered load {args.load}, give-up {args.give_up_s:.0f}s, seed {args.seed}")
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    print_table(rows, [("gang_share", "gangs", ".0%"), ("gangs", "n gangs", "d"), ("policy", "policy", ""), ("partial_gpu_h", "partial GPU-h", ".1f"),
                       ("deadlocks", "deadlocks", "d"), ("deadlock_h", "deadlock h", ".2f"), ("gave_up", "gave up", "d"),
                       ("gang_wait_p50_s", "gang wait p50 s", ".0f"), ("gang_wait_p95_s", "gang wait p95 s", ".0f"),
                       ("single_wait_p95_s", "single wait p95 s", ".0f"),
                       ("mean_running_gpu_frac", "GPU busy", ".3f"), ("makespan_h", "makespan h", ".1f")])
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
