"""Idle reclaim on real GPU duty cycles: Ray autoscaler v2's idle termination vs raygpu's reclaimer.

A discrete-time simulation, one step per trace sample (57 s), of ``--clusters``
RayClusters with one worker group ``gpu`` of ``--gpus-per-pod`` GPUs per pod.
What is real and what is synthesized:

* **Idle and busy periods (real)**: the per-pod GPU duty-cycle series of
  ``alibaba-genai-v2026/pod_gpu_duty_cycle_anon.csv`` (Alibaba clusterdata,
  read from the tar.gz without extracting it): 143 pods, one sample per 57 s,
  22.8 h. Each trace pod is a *stream*: a serving replica that is busy at a
  step when its utilisation is above ``--busy-threshold`` (5%), idle
  otherwise. A stream exists from its first to its last sample (a gap of up to
  5 samples holds the last value; a longer one is idle). Streams go to the
  clusters round-robin in pod-id order. A busy stream needs a whole worker pod
  (a Ray task ``{"GPU": G}``): it keeps the pod it runs on while busy, releases
  it when idle, and when busy again takes its previous pod if free, else the
  first free pod (creation order), else it waits (a pending resource request)
  for the autoscaler. Demand follows the trace: work that waits is not made up
  later.
* **Placement groups (synthesized)**: Poisson arrivals, ``--pg-rate`` per hour
  per cluster (seeded); 1 to ``--pg-max-bundles`` (4) bundles ``{"GPU": g}``,
  g in {1, 2, 4} (at most G); ``STRICT_SPREAD`` with probability ``--spread-share`` (when >1 bundle),
  else ``PACK``; held for an exponential time (mean ``--pg-life-min``) once
  placed. The GCS places a pending PG atomically (all bundles or none), first
  fit over live workers in creation order (STRICT_SPREAD: distinct workers).
  A worker hosting a bundle is not idle, as in Ray (a bundle allocates the
  node's resources).
* **Scale-up (identical for both)**: each step Ray's own
  ``ray.autoscaler.v2.scheduler.ResourceDemandScheduler.schedule`` is called
  with a real ``SchedulingRequest`` (RAY_RUNNING instances with ``NodeState``
  and idle durations, ALLOCATED instances for pods still starting, one
  ``ResourceRequestByCount`` for the waiting streams, one
  ``GangResourceRequest`` per pending PG, with the ``_PG_<id>`` anti-affinity
  of STRICT_SPREAD), and its ``to_launch`` creates pods, whose Ray node comes
  up ``--startup-s`` later. Deletions take effect at once (KubeRay deletes a
  listed pod within seconds) and never race with new work.

Policies (scale-down only; same ``--idle-timeout`` for both):

* ``ray-v2``: the same ``schedule`` call with ``idle_timeout_s`` set; every
  ``to_terminate`` with cause ``IDLE`` is deleted (Ray skips an idle node that
  its own placement of the pending demands uses).
* ``raygpu``: ``raygpu.plan.reclaim.plan_reclaim`` on a ``Snapshot`` (Ray nodes
  with ``idle_since_s``, the PG table, the pods) and a ``RayClusterView``;
  its ``deleted_pods`` are deleted. Ray's scheduler is then called with
  ``idle_timeout_s=None`` for the launches (the docs' setup: autoscaler
  scales up, raygpu scales down).

Metrics (summed over clusters): idle GPU-h (GPUs of live workers with no task
and no bundle), provisioned GPU-h (all pods, starting ones included), waiting
GPU-h (busy streams without a pod), PGs broken (a removed worker held one of
their bundles), PGs delayed (a worker was removed while the PG was pending and
that worker, at removal, had free GPUs for one of the PG's unplaced bundles),
PG wait p50/p95 (arrival to placement; still pending at the end counts to the
end), churn (pods removed that never ran a task nor held a bundle),
scale-downs and launches. Two diagnostics say whether the policies *could*
differ: ``contested`` counts cluster-steps with a pending PG and a live
worker idle past the timeout (the only moments where the pending-PG
protections of either policy matter), and ``disagree`` counts the steps of
the ``ray-v2`` run where ``plan_reclaim``, called on the very same state (not
applied), would have deleted a different set of pods than Ray did.

Ray's ``SchedulingRequest`` is built here, not imported from
``bench_decision_cost.py``: that one builds a fixed synthetic state
(``ray_request(n)``), while this one mirrors an evolving cluster; both use the
same classes and conventions (``AutoscalerInstance`` = IM ``Instance`` + GCS
``NodeState``, instance id = pod name).

    python -m benchmarks.bench_idle_reclaim            # 143 streams, 22.8 h, 2 clusters, timeouts 60 and 300 s
    python -m benchmarks.bench_idle_reclaim --quick    # 24 streams, 3 h, 1 cluster
    python -m benchmarks.bench_idle_reclaim --idle-timeout 300 --max-replicas 24   # quota-capped clusters
    python -m benchmarks.bench_idle_reclaim --json --no-plot
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import random
import tarfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks._common import TRACES, machine, machine_line, need_traces, percentile, print_table, save_plot
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimMode, ReclaimPolicy, ReclaimReason
from raygpu.model.views import PgState, Snapshot
from raygpu.plan.reclaim import plan_reclaim
from raygpu.testing.builders import cluster_view, snap

GENAI = TRACES / "alibaba-genai-v2026"
TRACE = GENAI / "pod_gpu_duty_cycle_anon.tar.gz"
MEMBER = "pod_gpu_duty_cycle_anon.csv"
POLICIES = ("ray-v2", "raygpu")
GROUP = "gpu"
NAMESPACE = "default"
CPUS_PER_POD = 16.0
GiB = 2**30
MAX_GAP_SAMPLES = 5  # a missing stretch up to this long holds the last value


# ------------------------------------------------------------------ trace
@dataclass(frozen=True)
class Trace:
    step_s: float
    n_steps: int
    pods: tuple[str, ...]  # anonymised pod ids, sorted
    samples: dict[str, dict[int, float]]  # pod -> step index -> utilisation (%)


def load_trace(path=TRACE) -> Trace:
    """Stream the CSV out of the tar.gz (nothing is extracted to disk)."""
    rows: list[tuple[str, float, float]] = []
    with tarfile.open(path, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv"))
        with tar.extractfile(member) as raw:  # type: ignore[union-attr]
            for r in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                rows.append((r["container_ip"], float(r["timestamp_anon"]), float(r["value"])))
    t0 = min(ts for _, ts, _ in rows)
    stamps = sorted({ts for _, ts, _ in rows})
    gaps = Counter(round(b - a) for a, b in zip(stamps, stamps[1:]))
    step_s = float(gaps.most_common(1)[0][0])
    samples: dict[str, dict[int, float]] = defaultdict(dict)
    for pod, ts, v in rows:
        samples[pod][int(round((ts - t0) / step_s))] = v
    n = max(max(s) for s in samples.values()) + 1
    return Trace(step_s=step_s, n_steps=n, pods=tuple(sorted(samples)), samples=dict(samples))


def busy_series(samples: dict[int, float], n_steps: int, threshold: float) -> list[int]:
    """Per step: 1 busy, 0 idle, -1 the pod does not exist (before its first / after its last sample)."""
    out = [-1] * n_steps
    first, last = min(samples), max(samples)
    held, since = 0.0, first
    for i in range(first, min(last, n_steps - 1) + 1):
        if i in samples:
            held, since = samples[i], i
        elif i - since > MAX_GAP_SAMPLES:
            held = 0.0
        out[i] = 1 if held > threshold else 0
    return out


# ------------------------------------------------------------- PG arrivals
@dataclass
class PG:
    pg_id: str  # hex, Ray's 18-byte PG id
    name: str
    bundles: tuple[float, ...]  # GPUs per bundle
    strategy: str
    arrive_s: float
    life_s: float
    placed_s: float | None = None
    removed_s: float | None = None
    nodes: list[str | None] = field(default_factory=list)  # pod name per bundle
    delayed: bool = False
    broken: bool = False


def make_pgs(cluster: int, seed: int, horizon_s: float, rate_per_h: float, spread_share: float,
             life_min: float, gpus_per_pod: float, max_bundles: int = 4) -> list[PG]:
    rng = random.Random(seed * 1_000_003 + cluster)
    out: list[PG] = []
    t = 0.0
    sizes = [g for g in (1.0, 2.0, 4.0) if g <= gpus_per_pod] or [gpus_per_pod]
    while rate_per_h > 0:
        t += rng.expovariate(rate_per_h / 3600.0)
        if t >= horizon_s:
            break
        k = rng.randint(1, max_bundles)
        g = rng.choice(sizes)
        strategy = "STRICT_SPREAD" if k > 1 and rng.random() < spread_share else "PACK"
        life = min(4 * 3600.0, max(60.0, rng.expovariate(1.0 / (life_min * 60.0))))
        n = len(out)
        out.append(PG(pg_id=f"{cluster:04x}{n:032x}", name=f"c{cluster}-pg{n}", bundles=(g,) * k,
                      strategy=strategy, arrive_s=t, life_s=life))
    return out


# --------------------------------------------------------------- the model
@dataclass
class Pod:
    name: str
    node_id: str  # Ray node id (hex)
    created_s: float
    up_s: float  # Ray node registers at this time
    up: bool = False
    task: int | None = None  # stream running on it
    bundles: dict[tuple[str, int], float] = field(default_factory=dict)  # (pg id, bundle index) -> GPUs
    idle_since_s: float | None = None  # None: busy, or not up yet
    used: bool = False  # ever ran a task or held a bundle


@dataclass
class Stream:
    busy: list[int]
    pod: str | None = None  # pod it runs on
    last_pod: str | None = None
    waiting_since_s: float | None = None


@dataclass
class Params:
    gpus_per_pod: float
    idle_timeout_s: float
    startup_s: float
    min_replicas: int
    max_replicas: int
    step_s: float


class Sim:
    """One RayCluster under one scale-down policy."""

    def __init__(self, index: int, policy: str, streams: list[list[int]], pgs: list[PG], p: Params,
                 shadow: bool = True):
        from ray.autoscaler.v2.scheduler import ResourceDemandScheduler

        self.index, self.policy, self.p, self.shadow = index, policy, p, shadow
        self.name = f"rc{index}"
        self.streams = [Stream(busy=s) for s in streams]
        self.pgs = pgs
        self.pending: list[PG] = []
        self.placed: list[PG] = []
        self.pods: dict[str, Pod] = {}
        self.n_created = 0
        self.scheduler = ResourceDemandScheduler()  # one per cluster, as the autoscaler keeps it
        self.reclaim_policy = ReclaimPolicy(idle_timeout_s=p.idle_timeout_s, mode=ReclaimMode.ON)
        self.m: Counter = Counter()
        self.series: list[tuple[float, ...]] = []
        self.decision_s = 0.0
        self.raygpu_reasons: Counter = Counter()
        # Warm start: one live pod per stream busy at step 0 (t = 0), identical for both policies.
        for sid, s in enumerate(self.streams):
            if s.busy[0] == 1:
                pod = self._create(-p.startup_s)
                pod.up, pod.task, pod.used = True, sid, True
                s.pod = s.last_pod = pod.name
        self.m["initial_pods"] = len(self.pods)

    # ---- state helpers
    def _create(self, now: float) -> Pod:
        self.n_created += 1
        name = f"{self.name}-{GROUP}-{self.n_created:05d}"
        pod = Pod(name=name, node_id=f"{self.index:04x}{self.n_created:052x}", created_s=now,
                  up_s=now + self.p.startup_s)
        self.pods[name] = pod
        return pod

    def _free(self, pod: Pod) -> float:
        return self.p.gpus_per_pod - (self.p.gpus_per_pod if pod.task is not None else 0.0) - sum(pod.bundles.values())

    def _touch(self, pod: Pod, now: float) -> None:
        """Recompute idleness after a change: idle since now when it just became empty."""
        empty = pod.up and pod.task is None and not pod.bundles
        if not empty:
            pod.idle_since_s = None
        elif pod.idle_since_s is None:
            pod.idle_since_s = now

    def _live(self) -> list[Pod]:
        return [pod for pod in self.pods.values() if pod.up]  # dict order = creation order

    # ---- one step
    def step(self, i: int) -> None:
        p = self.p
        now = i * p.step_s
        for pod in self.pods.values():
            if not pod.up and pod.up_s <= now:
                pod.up = True
                pod.idle_since_s = pod.up_s
        for pg in [x for x in self.placed if x.placed_s is not None and x.placed_s + x.life_s <= now]:
            self._remove_pg(pg, now)
        for sid, s in enumerate(self.streams):
            b = s.busy[i]
            if b == 1 and s.pod is None and s.waiting_since_s is None:
                s.waiting_since_s = now
            elif b != 1:
                s.waiting_since_s = None
                if s.pod is not None:
                    pod = self.pods[s.pod]
                    pod.task, s.pod = None, None
                    self._touch(pod, now)
        while self.pgs and self.pgs[0].arrive_s <= now:
            pg = self.pgs.pop(0)
            pg.nodes = [None] * len(pg.bundles)
            self.pending.append(pg)
            self.m["pgs"] += 1
        self._place(now)
        self._decide(now)
        self._account(now)

    def _remove_pg(self, pg: PG, now: float) -> None:
        pg.removed_s = now
        self.placed.remove(pg)
        for bi, node in enumerate(pg.nodes):
            if node in self.pods:
                pod = self.pods[node]
                pod.bundles.pop((pg.pg_id, bi), None)
                self._touch(pod, now)

    def _place(self, now: float) -> None:
        """Ray's GCS and raylets: waiting work in arrival order, streams to whole free pods, PGs atomically."""
        items: list[tuple[float, int, int, Any]] = []
        for sid, s in enumerate(self.streams):
            if s.waiting_since_s is not None:
                items.append((s.waiting_since_s, 0, sid, s))
        for pg in self.pending:
            items.append((pg.arrive_s, 1, int(pg.pg_id, 16), pg))
        for _, kind, sid, obj in sorted(items, key=lambda x: x[:3]):
            live = self._live()
            if kind == 0:
                s: Stream = obj
                free = [pod for pod in live if pod.task is None and not pod.bundles]
                if not free:
                    continue
                last = self.pods.get(s.last_pod or "")
                pod = last if last in free else free[0]
                pod.task, pod.used = sid, True
                s.pod = s.last_pod = pod.name
                s.waiting_since_s = None
                self.m["wait_events"] += 1
                self._touch(pod, now)
            else:
                self._place_pg(obj, live, now)

    def _place_pg(self, pg: PG, live: list[Pod], now: float) -> None:
        avail = {pod.name: self._free(pod) for pod in live}
        chosen: list[str] = []
        for g in pg.bundles:  # all bundles of a PG have the same size here
            spots = [n for n, a in avail.items() if a + 1e-9 >= g
                     and not (pg.strategy == "STRICT_SPREAD" and n in chosen)]
            if not spots:
                return  # all or nothing: stays pending
            chosen.append(spots[0])
            avail[spots[0]] -= g
        pg.placed_s = now
        pg.nodes = list(chosen)
        self.pending.remove(pg)
        self.placed.append(pg)
        for bi, (g, n) in enumerate(zip(pg.bundles, chosen)):
            pod = self.pods[n]
            pod.bundles[(pg.pg_id, bi)] = g
            pod.used = True
            self._touch(pod, now)

    # ---- decisions
    def _decide(self, now: float) -> None:
        t0 = time.perf_counter()
        if self.policy == "ray-v2":
            reply = self.scheduler.schedule(self.ray_request(now, self.p.idle_timeout_s))
            self.m["decision_calls"] += 1
            doomed = self._ray_terminations(reply)
            self.decision_s += time.perf_counter() - t0
            if self.shadow:  # what raygpu would delete in this very state (not applied, not timed)
                shadow = set(plan_reclaim(self.snapshot(now), self.cluster_view(), self.reclaim_policy,
                                          now).deleted_pods)
                self.m["shadow_only_ray"] += len(set(doomed) - shadow)
                self.m["shadow_only_raygpu"] += len(shadow - set(doomed))
                self.m["shadow_disagree_steps"] += shadow != set(doomed)
        else:
            plan = plan_reclaim(self.snapshot(now), self.cluster_view(), self.reclaim_policy, now)
            self.m["decision_calls"] += 1
            self.raygpu_reasons.update(d.reason.value for d in plan.decisions)
            doomed = list(plan.deleted_pods)
            self.decision_s += time.perf_counter() - t0
        self._count_kept_past_timeout(now, set(doomed))
        for name in doomed:
            self._delete(name, now)
        if self.policy == "raygpu":  # Ray's autoscaler still scales up, on the state after raygpu's deletions
            reply = self.scheduler.schedule(self.ray_request(now, None))
            self.m["other_terminations"] += len(reply.to_terminate)
        for lr in reply.to_launch:
            for _ in range(lr.count):
                self._create(now)
                self.m["launches"] += 1

    def _ray_terminations(self, reply) -> list[str]:
        from ray.core.generated.instance_manager_pb2 import TerminationRequest

        out = []
        for tr in reply.to_terminate:
            if tr.cause == TerminationRequest.Cause.IDLE:
                out.append(tr.instance_id)  # instance id == pod name here
            else:
                self.m["other_terminations"] += 1
        return out

    def _count_kept_past_timeout(self, now: float, doomed: set[str]) -> None:
        past = [pod for pod in self._live()
                if pod.idle_since_s is not None and now - pod.idle_since_s > self.p.idle_timeout_s]
        self.m["pending_pg_steps"] += bool(self.pending)
        self.m["contested_steps"] += bool(self.pending and past)  # a protection could matter here
        for pod in self._live():
            if (pod.idle_since_s is not None and now - pod.idle_since_s > self.p.idle_timeout_s
                    and pod.name not in doomed):
                self.m["kept_idle_past_timeout"] += 1

    def _delete(self, name: str, now: float) -> None:
        pod = self.pods.pop(name)
        self.m["scale_downs"] += 1
        if not pod.used:
            self.m["churn"] += 1
        if pod.task is not None:  # never expected: both policies remove idle workers only
            s = self.streams[pod.task]
            s.pod, s.waiting_since_s = None, now
            self.m["work_killed"] += 1
        for (pg_id, _), _g in list(pod.bundles.items()):  # never expected either
            pg = next(x for x in self.placed if x.pg_id == pg_id)
            if not pg.broken:
                pg.broken = True
                self.m["pg_broken"] += 1
                self._remove_pg(pg, now)  # its job fails
        if pod.up:
            free = self._free(pod)
            for pg in self.pending:
                if not pg.delayed and any(g <= free + 1e-9 for g, n in zip(pg.bundles, pg.nodes) if n is None):
                    pg.delayed = True
                    self.m["pg_delayed"] += 1

    def _account(self, now: float) -> None:
        g, dt = self.p.gpus_per_pod, self.p.step_s
        pods = list(self.pods.values())
        live = [x for x in pods if x.up]
        idle = [x for x in live if x.idle_since_s is not None]
        task = sum(1 for x in live if x.task is not None) * g
        bundle = sum(sum(x.bundles.values()) for x in live)
        demand = sum(1 for s in self.streams if s.pod is not None or s.waiting_since_s is not None) * g
        waiting = sum(1 for s in self.streams if s.waiting_since_s is not None) * g
        self.m["provisioned_gpu_s"] += len(pods) * g * dt
        self.m["alive_gpu_s"] += len(live) * g * dt
        self.m["idle_gpu_s"] += len(idle) * g * dt
        self.m["task_gpu_s"] += task * dt
        self.m["bundle_gpu_s"] += bundle * dt
        self.m["demand_gpu_s"] += demand * dt
        self.m["waiting_gpu_s"] += waiting * dt
        self.m["max_pods"] = max(self.m["max_pods"], len(pods))
        self.m["at_cap_steps"] += len(pods) >= self.p.max_replicas
        self.series.append((now, len(pods) * g, len(live) * g, len(idle) * g, task + bundle, demand))

    # ---- the two views of the same state
    def ray_request(self, now: float, idle_timeout_s: float | None):
        """Ray autoscaler v2's SchedulingRequest for the current state (what the GCS would report)."""
        from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
        from ray.autoscaler.v2.scheduler import SchedulingRequest
        from ray.autoscaler.v2.schema import AutoscalerInstance
        from ray.core.generated.autoscaler_pb2 import (
            AntiAffinityConstraint,
            GangResourceRequest,
            NodeState,
            NodeStatus,
            PlacementConstraint,
            ResourceRequest,
            ResourceRequestByCount,
        )
        from ray.core.generated.instance_manager_pb2 import Instance, NodeKind

        g = self.p.gpus_per_pod
        total = {"CPU": CPUS_PER_POD, "GPU": g}
        cfg = {GROUP: NodeTypeConfig(name=GROUP, min_worker_nodes=self.p.min_replicas,
                                     max_worker_nodes=self.p.max_replicas, resources=dict(total))}
        spread = {pg.pg_id for pg in self.placed if pg.strategy == "STRICT_SPREAD"}
        inst = []
        for pod in self.pods.values():
            if pod.up:
                im = Instance(instance_id=pod.name, instance_type=GROUP, status=Instance.RAY_RUNNING,
                              node_id=pod.node_id, cloud_instance_id=pod.name, node_kind=NodeKind.WORKER)
                idle = pod.idle_since_s is not None
                rn = NodeState(node_id=bytes.fromhex(pod.node_id), instance_id=pod.name, ray_node_type_name=GROUP,
                               total_resources=total,
                               available_resources={"CPU": CPUS_PER_POD, "GPU": self._free(pod)},
                               status=NodeStatus.IDLE if idle else NodeStatus.RUNNING,
                               idle_duration_ms=int((now - pod.idle_since_s) * 1000) if idle else 0,
                               dynamic_labels={f"_PG_{pid}": "" for pid, _ in pod.bundles if pid in spread})
                inst.append(AutoscalerInstance(cloud_instance_id=pod.name, ray_node=rn, im_instance=im))
            else:
                im = Instance(instance_id=pod.name, instance_type=GROUP, status=Instance.ALLOCATED,
                              cloud_instance_id=pod.name, node_kind=NodeKind.WORKER)
                inst.append(AutoscalerInstance(cloud_instance_id=pod.name, ray_node=None, im_instance=im))
        waiting = sum(1 for s in self.streams if s.waiting_since_s is not None)
        reqs = ([ResourceRequestByCount(request=ResourceRequest(resources_bundle={"GPU": g}), count=waiting)]
                if waiting else [])
        gangs = []
        for pg in self.pending:
            cons = ([PlacementConstraint(anti_affinity=AntiAffinityConstraint(label_name=f"_PG_{pg.pg_id}",
                                                                              label_value=""))]
                    if pg.strategy == "STRICT_SPREAD" else [])
            gangs.append(GangResourceRequest(
                requests=[ResourceRequest(resources_bundle={"GPU": b}, placement_constraints=cons)
                          for b, n in zip(pg.bundles, pg.nodes) if n is None],
                details=f"{pg.name}:{pg.strategy}|PENDING"))
        return SchedulingRequest(disable_launch_config_check=True, node_type_configs=cfg,
                                 idle_timeout_s=idle_timeout_s, resource_requests=reqs,
                                 gang_resource_requests=gangs, current_instances=inst)

    def snapshot(self, now: float) -> Snapshot:
        """raygpu's view of the same state: Ray nodes with idle_since_s, the PG table, the pods."""
        g = self.p.gpus_per_pod
        b = snap(now, self.name, namespace=NAMESPACE, ids=False)
        for pod in self.pods.values():
            b.ray_pod(pod.name, f"node-{pod.name}", phase="Running" if pod.up else "Pending",
                      created_at_s=pod.created_s, cluster=self.name, group=GROUP, requests={"nvidia.com/gpu": g})
            if pod.up:
                b.ray_node(pod.node_id, pod.name, node_type=GROUP, total={"CPU": CPUS_PER_POD, "GPU": g},
                           available={"CPU": CPUS_PER_POD, "GPU": self._free(pod)}, idle_since_s=pod.idle_since_s)
        by_name = {pod.name: pod.node_id for pod in self.pods.values()}
        for pg in (*self.placed, *self.pending):
            b.pg(pg.pg_id, name=pg.name, state=PgState.CREATED if pg.placed_s is not None else PgState.PENDING,
                 strategy=pg.strategy, bundles=tuple({"GPU": x} for x in pg.bundles),
                 node_ids=tuple(by_name.get(n) if n else None for n in pg.nodes))
        return b.obj()

    def cluster_view(self) -> RayClusterView:
        g = self.p.gpus_per_pod
        res = {"cpu": CPUS_PER_POD, "memory": 64.0 * GiB, "nvidia.com/gpu": g}
        return (cluster_view(self.name, NAMESPACE, resource_version=str(self.n_created))
                .head(limits={"cpu": 4, "memory": 16 * GiB})
                .group(GROUP, replicas=len(self.pods), min_replicas=self.p.min_replicas,
                       max_replicas=self.p.max_replicas, limits=res, requests=res).obj())


def run_policy(policy: str, trace: Trace, args, timeout_s: float, cap: int, steps: int) -> dict[str, Any]:
    """Simulate every cluster under one policy; cap 0 = each cluster's streams + 8 (never binding in practice)."""
    streams_all = [busy_series(trace.samples[p], trace.n_steps, args.busy_threshold) for p in stream_ids(trace, args)]
    per_cluster: list[list[list[int]]] = [[] for _ in range(args.clusters)]
    for k, s in enumerate(streams_all):
        per_cluster[k % args.clusters].append(s)
    sims: list[Sim] = []
    arrived: list[list[PG]] = []
    for c, streams in enumerate(per_cluster):
        pgs = make_pgs(c, args.seed, steps * trace.step_s, args.pg_rate, args.spread_share, args.pg_life_min,
                       args.gpus_per_pod, args.pg_max_bundles)
        arrived.append(list(pgs))
        p = Params(gpus_per_pod=args.gpus_per_pod, idle_timeout_s=timeout_s, startup_s=args.startup_s,
                   min_replicas=args.min_replicas, max_replicas=cap or (len(streams) + 8), step_s=trace.step_s)
        sims.append(Sim(c, policy, streams, pgs, p))
    for i in range(steps):
        for sim in sims:
            sim.step(i)
    end_s = steps * trace.step_s
    m: Counter = Counter()
    waits: list[float] = []
    reasons: Counter = Counter()
    for sim, pgs in zip(sims, arrived):
        m.update(sim.m)
        reasons.update(sim.raygpu_reasons)
        for pg in pgs:
            waits.append((pg.placed_s if pg.placed_s is not None else end_s) - pg.arrive_s)
        m["pgs_unplaced"] += sum(1 for pg in pgs if pg.placed_s is None)
        m["decision_s"] += sim.decision_s
    m["max_pods"] = sum(sim.m["max_pods"] for sim in sims)
    series = [tuple(sum(col) for col in zip(*rows)) for rows in zip(*(sim.series for sim in sims))]
    series = [(r[0] / len(sims), *r[1:]) for r in series]
    h = 3600.0
    row = {
        "policy": policy,
        "idle_timeout_s": timeout_s,
        "max_replicas": cap or None,
        "clusters": args.clusters,
        "streams": sum(len(s.streams) for s in sims),
        "steps": steps,
        "demand_gpu_h": round(m["demand_gpu_s"] / h, 2),
        "provisioned_gpu_h": round(m["provisioned_gpu_s"] / h, 2),
        "alive_gpu_h": round(m["alive_gpu_s"] / h, 2),
        "idle_gpu_h": round(m["idle_gpu_s"] / h, 2),
        "task_gpu_h": round(m["task_gpu_s"] / h, 2),
        "bundle_gpu_h": round(m["bundle_gpu_s"] / h, 2),
        "waiting_gpu_h": round(m["waiting_gpu_s"] / h, 2),
        "pgs": m["pgs"],
        "pgs_unplaced": m["pgs_unplaced"],
        "pg_broken": m["pg_broken"],
        "pg_delayed": m["pg_delayed"],
        "pg_wait_p50_s": round(percentile(waits, 50), 1),
        "pg_wait_p95_s": round(percentile(waits, 95), 1),
        "pg_wait_mean_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "initial_pods": m["initial_pods"],
        "launches": m["launches"],
        "scale_downs": m["scale_downs"],
        "churn": m["churn"],
        "work_killed": m["work_killed"],
        "other_terminations": m["other_terminations"],
        "kept_idle_past_timeout": m["kept_idle_past_timeout"],
        "at_cap_steps": m["at_cap_steps"],
        "pending_pg_steps": m["pending_pg_steps"],
        "contested_steps": m["contested_steps"],
        "max_pods": m["max_pods"],
        "decision_calls": m["decision_calls"],
        "decision_ms_mean": round(m["decision_s"] * 1e3 / m["decision_calls"], 2) if m["decision_calls"] else None,
    }
    if policy == "ray-v2":
        row["shadow_disagree_steps"] = m["shadow_disagree_steps"]
        row["shadow_only_ray"] = m["shadow_only_ray"]
        row["shadow_only_raygpu"] = m["shadow_only_raygpu"]
    if policy == "raygpu":
        row["raygpu_needed_by_pending_pg"] = reasons.get(ReclaimReason.NEEDED_BY_PENDING_PG.value, 0)
        row["raygpu_holds_bundle"] = reasons.get(ReclaimReason.HOLDS_BUNDLE.value, 0)
    return {"row": row, "series": series}


def stream_ids(trace: Trace, args) -> tuple[str, ...]:
    return trace.pods[: args.streams] if args.streams else trace.pods


def plot(series: dict[str, list[tuple[float, ...]]], name: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(10, 3.2 * len(series)), sharex=True, sharey=True)
    for ax, (pol, s) in zip(axes, series.items()):
        t = [(x[0] - s[0][0]) / 3600 for x in s]
        ax.plot(t, [x[2] for x in s], lw=0.8, label="alive Ray workers", color="tab:blue")
        ax.plot(t, [x[1] for x in s], lw=0.6, ls="--", label="provisioned (pods, incl. starting)", color="black")
        ax.plot(t, [x[4] for x in s], lw=0.8, label="used (tasks + PG bundles)", color="tab:green")
        ax.fill_between(t, 0, [x[3] for x in s], step=None, alpha=0.35, color="tab:red", label="idle workers")
        ax.set_ylabel(f"{pol}\nGPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=7, ncol=2)
    axes[0].set_title(title, fontsize=9)
    axes[-1].set_xlabel("hours")
    return save_plot(fig, name)


COLUMNS = [("idle_timeout_s", "timeout s", ".0f"), ("max_replicas", "cap", "d"), ("policy", "policy", ""),
           ("demand_gpu_h", "demand GPU-h", ".1f"), ("provisioned_gpu_h", "provisioned GPU-h", ".1f"),
           ("idle_gpu_h", "idle GPU-h", ".1f"), ("waiting_gpu_h", "waiting GPU-h", ".1f"),
           ("pgs", "PGs", "d"), ("pg_broken", "broken", "d"), ("pg_delayed", "delayed", "d"),
           ("pg_wait_p50_s", "PG wait p50 s", ".0f"), ("pg_wait_p95_s", "PG wait p95 s", ".0f"),
           ("launches", "launches", "d"), ("scale_downs", "scale-downs", "d"), ("churn", "churn", "d"),
           ("contested_steps", "contested", "d"), ("shadow_disagree_steps", "disagree", "d"),
           ("decision_ms_mean", "decide ms", ".1f")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="24 streams, 3 h, 1 cluster")
    ap.add_argument("--idle-timeout", type=float, nargs="+", default=None,
                    help="idle timeout(s) in seconds, one run each, the same for both policies (default 60 300)")
    ap.add_argument("--clusters", type=int, default=None, help="RayClusters (default 2; quick 1)")
    ap.add_argument("--streams", type=int, default=None, help="trace pods used (default all 143; quick 24)")
    ap.add_argument("--hours", type=float, default=None, help="simulated hours (default the whole trace; quick 3)")
    ap.add_argument("--busy-threshold", type=float, default=5.0, help="a pod is busy when its GPU utilisation %% > this")
    ap.add_argument("--gpus-per-pod", type=float, default=4.0)
    ap.add_argument("--startup-s", type=float, default=180.0, help="pod creation to Ray node up")
    ap.add_argument("--min-replicas", type=int, default=0)
    ap.add_argument("--max-replicas", type=int, nargs="+", default=None,
                    help="maxReplicas per cluster, one run each; 0 (default) = its streams + 8, never binding")
    ap.add_argument("--pg-rate", type=float, default=6.0, help="placement groups per hour per cluster")
    ap.add_argument("--spread-share", type=float, default=0.3, help="share of multi-bundle PGs that are STRICT_SPREAD")
    ap.add_argument("--pg-max-bundles", type=int, default=4, help="bundles per PG: uniform 1..this")
    ap.add_argument("--pg-life-min", type=float, default=20.0, help="mean PG lifetime once placed, minutes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if not need_traces(TRACE):
        return 0
    logging.getLogger("ray").setLevel(logging.ERROR)
    args.clusters = args.clusters or (1 if args.quick else 2)
    if args.streams is None and args.quick:
        args.streams = 24
    timeouts = args.idle_timeout or [60.0, 300.0]
    caps = args.max_replicas or [0]
    t_start = time.perf_counter()
    trace = load_trace()
    load_s = time.perf_counter() - t_start
    hours = args.hours or (3.0 if args.quick else None)
    steps = min(trace.n_steps, int(round(hours * 3600 / trace.step_s))) if hours else trace.n_steps
    rows, plots = [], []
    for timeout in timeouts:
        for cap in caps:
            series = {}
            for pol in POLICIES:
                out = run_policy(pol, trace, args, float(timeout), cap, steps)
                rows.append(out["row"])
                series[pol] = out["series"]
            if not args.no_plot:
                suffix = "_quick" if args.quick else ""
                cap_s = f"max {cap} pods/cluster" if cap else "no cap"
                name = f"idle_reclaim_timeline_t{int(timeout)}{f'_cap{cap}' if cap else ''}{suffix}.png"
                plots.append(plot(series, name,
                                  f"alibaba-genai-v2026 duty cycles, {rows[-1]['streams']} streams in {args.clusters} "
                                  f"RayCluster(s), {cap_s}, idle timeout {timeout:.0f}s, start-up "
                                  f"{args.startup_s:.0f}s, {args.pg_rate:g} PGs/h/cluster"))
    elapsed = time.perf_counter() - t_start
    params = {"idle_timeouts_s": [float(t) for t in timeouts], "clusters": args.clusters,
              "streams": rows[0]["streams"], "steps": steps, "step_s": trace.step_s,
              "hours": round(steps * trace.step_s / 3600, 2), "busy_threshold_pct": args.busy_threshold,
              "gpus_per_pod": args.gpus_per_pod, "startup_s": args.startup_s, "min_replicas": args.min_replicas,
              "max_replicas": caps, "pg_rate_per_h": args.pg_rate, "spread_share": args.spread_share,
              "pg_life_min": args.pg_life_min, "seed": args.seed, "quick": args.quick}
    result = {"benchmark": "idle_reclaim", "machine": machine(), "params": params,
              "data": {"trace": f"alibaba-genai-v2026/{TRACE.name}:{MEMBER}", "trace_pods": len(trace.pods),
                       "trace_steps": trace.n_steps, "synthesized": "placement groups, pods, scale-up timing"},
              "elapsed_s": round(elapsed, 2), "trace_load_s": round(load_s, 2), "plots": plots, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"idle reclaim: {params['streams']} duty-cycle streams (alibaba-genai-v2026) in {args.clusters} RayCluster(s), "
          f"{params['hours']} h in {trace.step_s:.0f}s steps, {args.gpus_per_pod:g} GPUs/pod, busy > "
          f"{args.busy_threshold:g}%, start-up {args.startup_s:.0f}s, {args.pg_rate:g} PGs/h/cluster, seed {args.seed}")
    print(machine_line(result["machine"]) + f"; simulated in {elapsed:.1f}s")
    print_table(rows, COLUMNS)
    for p in plots:
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
