"""The idle-reclaim benchmark's simulation: one RayCluster under one scale-down policy, step by step.

Ray's ``ResourceDemandScheduler`` and raygpu's ``plan_reclaim`` decide; see
``bench_idle_reclaim.py`` for the model and the policies.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchmarks._idle_reclaim_trace import PG
from benchmarks._idle_reclaim_warm import keep_warm_policy
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimMode, ReclaimPolicy
from raygpu.model.views import PgState, ResourceDemand, Snapshot
from raygpu.model.warm import WarmHistory, WarmSettings
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders import cluster_view, snap

GROUP = "gpu"
NAMESPACE = "default"
CPUS_PER_POD = 16.0
GiB = 2**30


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
    quantile: float = 0.8  # auto: the keep-warm quantile
    oracle: list[int] | None = None  # oracle: per step, the workers demand will need (perfect foresight)
    oracle_pg_steps: tuple[int, ...] = ()  # oracle-pg: the steps where a PG arrives
    oracle_horizon_s: float | None = None  # oracle / oracle-pg: how far ahead it looks (None: one start-up)
    warm_step_s: float | None = None  # auto: the learner's sample step (default step_s)
    hold_startups: float = 0.0  # auto: WarmSettings.hold_startups
    warm_history: WarmHistory | None = None  # auto: the history it starts with (None: cold, no history)


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
        # auto: the sidecar's keep-warm learner, fed what the sidecar would see (plan.warm)
        self.warm = WarmSettings(quantile=p.quantile, step_s=p.warm_step_s or p.step_s, hold_startups=p.hold_startups,
                                 fallback_timeout_s=p.idle_timeout_s)
        self.warm_history = p.warm_history or WarmHistory()
        self._last_sig: tuple | None = None  # the state of the last schedule call whose reply was empty
        self._call_sig: tuple | None = None
        self.startups: list[float] = []  # pod start-ups seen this step (creation -> Ray node up)
        self.warm_targets: list[int] = []
        self.first_warm_s: float | None = None  # auto: when it first had a learned target (the fallback before)
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
                self.startups.append(now - pod.created_s)  # as the sidecar measures it: the cycle that sees it
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
        if self.policy == "ray-v2" and self._skip(now, self.p.idle_timeout_s):
            # Ray's reply is known to be empty (see _skip): the call is skipped (counted, not timed)
            self.m["decision_skipped"] += 1
            self._count_kept_past_timeout(now, set())
            return
        if self.policy == "ray-v2":
            reply = self.scheduler.schedule(self.ray_request(now, self.p.idle_timeout_s))
            self._remember(reply)
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
            plan = plan_reclaim(self.snapshot(now), self.cluster_view(), self._policy(now, self.reclaim_policy), now)
            self.m["decision_calls"] += 1
            self.raygpu_reasons.update(d.reason.value for d in plan.decisions)
            doomed = list(plan.deleted_pods)
            self.decision_s += time.perf_counter() - t0
        self._count_kept_past_timeout(now, set(doomed))
        for name in doomed:
            self._delete(name, now)
        if self.policy != "ray-v2":  # Ray's autoscaler still scales up, on the state after raygpu's deletions
            if self._skip(now, None):
                return  # Ray's reply is known to be empty (see _skip)
            reply = self.scheduler.schedule(self.ray_request(now, None))
            self._remember(reply)
            self.m["other_terminations"] += len(reply.to_terminate)
        for lr in reply.to_launch:
            for _ in range(lr.count):
                self._create(now)
                self.m["launches"] += 1

    def _skip(self, now: float, idle_timeout_s: float | None) -> bool:
        """True when Ray's ``schedule`` would return nothing, so it need not be called: the state is quiet
        (``_quiet``), or it is the very state of the last call, whose reply was empty, and (with a timeout) no
        worker is idle for the timeout. The call is a function of the request: the same request, the same
        reply; only idle durations grow, and they matter only past the timeout."""
        if self._quiet(now, idle_timeout_s):
            return True
        sig = self._signature()
        if sig == self._last_sig and (idle_timeout_s is None or not self._past(now, idle_timeout_s)):
            return True
        self._call_sig = sig
        return False

    def _remember(self, reply) -> None:
        self._last_sig = None if (reply.to_launch or reply.to_terminate) else self._call_sig

    def _signature(self) -> tuple:
        """Everything of the state Ray's request carries, but idle durations."""
        return (sum(1 for s in self.streams if s.waiting_since_s is not None),
                tuple((pg.pg_id, tuple(n is None for n in pg.nodes)) for pg in self.pending),
                tuple((pod.name, pod.up, pod.idle_since_s is None, self._free(pod), tuple(sorted(pod.bundles)))
                      for pod in self.pods.values()))

    def _past(self, now: float, idle_timeout_s: float) -> bool:
        return any(pod.idle_since_s is not None and now - pod.idle_since_s >= idle_timeout_s - 1e-6
                   for pod in self.pods.values() if pod.up)

    def _quiet(self, now: float, idle_timeout_s: float | None) -> bool:
        """True when Ray's ``schedule`` would return nothing: no waiting stream, no pending PG, no pod short of
        min_replicas and (with a timeout) no live worker idle for the timeout or longer."""
        if self.pending or any(s.waiting_since_s is not None for s in self.streams):
            return False
        if len(self.pods) < self.p.min_replicas:
            return False
        if idle_timeout_s is None:
            return True
        return not self._past(now, idle_timeout_s)

    def _policy(self, now: float, base: ReclaimPolicy) -> ReclaimPolicy:
        return keep_warm_policy(self, now, base)  # raygpu: base; auto and oracle: benchmarks._idle_reclaim_warm

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
        # (t, provisioned, alive, idle, used, demand GPUs; cumulative launches and idle GPU-s: the cold-start match)
        self.series.append((now, len(pods) * g, len(live) * g, len(idle) * g, task + bundle, demand,
                            self.m["launches"], self.m["idle_gpu_s"]))

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
        out = b.obj()
        waiting = sum(1 for s in self.streams if s.waiting_since_s is not None)
        if not waiting:
            return out
        demand = (ResourceDemand(bundle={"GPU": g}, count=waiting),)  # Ray's pending tasks, one per waiting stream
        return out.model_copy(update={"ray": out.ray.model_copy(update={"resource_demand": demand})})

    def cluster_view(self) -> RayClusterView:
        g = self.p.gpus_per_pod
        res = {"cpu": CPUS_PER_POD, "memory": 64.0 * GiB, "nvidia.com/gpu": g}
        return (cluster_view(self.name, NAMESPACE, resource_version=str(self.n_created))
                .head(limits={"cpu": 4, "memory": 16 * GiB})
                .group(GROUP, replicas=len(self.pods), min_replicas=self.p.min_replicas,
                       max_replicas=self.p.max_replicas, limits=res, requests=res).obj())
