"""The sidecar's cycle: snapshot -> plan -> apply, for one RayCluster.

One cycle, in order:

1. Kubernetes view from the watch cache (no LIST): the RayCluster, its pods,
   its reservation ConfigMaps. Reservations are read before Ray on purpose
   (see ``raygpu.plan.reclaim.gc``).
2. Policy from the RayCluster's annotations; each distinct bad value gives one
   ``InvalidAnnotation`` Event and its safe default. Mode ``off`` stops here.
3. Ray's view from the GCS (nodes, placement groups) and its job table,
   joined with step 1 into one ``CycleState``; groups in ``auto`` get their keep-warm targets (``reclaim.warm``).
   3b. Health (``raygpu.io/doctor-interval``, off by default): when due, the doctor's checks for this cluster
   (``reclaim.health``: the ``raygpu_doctor_findings`` gauge, ``DoctorFinding`` Warning Events); the nodes
   a health agent marked unhealthy, as of the last health cycle, go into the policy (reclaimed first, never
   kept warm) and into gang scale-up's reservations (kept off them).
4. One pure decision, ``plan_cycle(state) -> CyclePlan``: ``plan_gc``
   (reservations to release), then ``plan_reclaim`` (workers to remove; every
   reservation with a state ConfigMap is left to the garbage collector).
5. Report: one log line per decision that changed, metrics; in ``dry-run``
   one ``ScaleDownDryRun`` Event per distinct plan, then only step 7, and stop.
6. Apply (mode ``on``): first Ray drains each worker to delete (idle termination, as Ray's autoscaler does;
   a refused drain keeps the worker: ``raygpu.reclaim.drain``), then one JSON patch on the RayCluster, first
   op a test of the resourceVersion the plan was made from. A conflict drops the plan and asks for an
   immediate new cycle from a new snapshot; it never overwrites. On success the written RayCluster is assumed
   into the cache and a ``ScaledDown`` Event per group lists the pods and why.
7. Garbage collection (every mode but ``off``: releasing a dead driver's reservation is the safe action):
   release each reservation of ``plan_gc`` with the gang module's release code, one step per cycle and never
   waiting: scale its group to zero, and once its pods are gone (a later cycle) remove the group and the
   ConfigMap (``apply_release``: errors are values). Only what the plan proved raygpu created is written (see
   ``raygpu.plan.reclaim.gc``); a release on heartbeat or deadline, judged from a cache a hung watch may leave stale,
   is first confirmed by a live read (``reclaim.confirm``).
8. The outcome: ``applied`` when anything was written, ``error`` when a release failed and nothing else happened.

``cycle`` never raises: every failure is a ``CycleOutcome`` and a log line, and the next cycle starts afresh.
Its configuration and result types live in ``raygpu.reclaim.report`` (imported here, as before).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import RayGpuError, TransientError
from raygpu.model.cycle import CycleState
from raygpu.model.annotations import parse_cluster_policy
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.gc import GcAction, GcPlan, GcReason, ReservationRecord
from raygpu.model.scale_up import ScaleUpPlan
from raygpu.model.raycluster import RayClusterView
from raygpu.model.labels import KEY_RECLAIM
from raygpu.model.reclaim import DecisionAction, ReclaimMode, ReclaimPlan, ReclaimPolicy
from raygpu.model.views import RayView
from raygpu.plan.common.collector import collector_paused
from raygpu.plan.reclaim.cycle import plan_cycle
from raygpu.adapters.ray_gcs import drain_idle_node
from raygpu.plan.reclaim.gc import NEEDS_LIVE_READ
from raygpu.plan.guard import guard_gauges
from raygpu.reclaim.apply import ApplyStatus, ReleaseStatus, apply_reclaim, apply_release
from raygpu.reclaim.confirm import confirm_release
from raygpu.reclaim.drain import DrainMemory, Drain, drain_workers
from raygpu.reclaim.health import HealthWatch
from raygpu.reclaim.memory import GcMemory
from raygpu.adapters.kube_watch import CacheView, ClusterCache
from raygpu.reclaim.metrics import SidecarMetrics
from raygpu.reclaim.report import BeforeApply, CycleOutcome, CycleReport, SidecarConfig
from raygpu.reclaim.scale_up import GangScaleUp
from raygpu.reclaim.warm import WarmKeeper

log = logging.getLogger("raygpu.sidecar")

MAX_IMMEDIATE_REPLANS = 5  # conflicts in a row re-planned at once; then the normal interval
CONFLICT_WAIT_S = 5.0  # how long to wait for the watch to deliver the write that beat us


class Reclaimer:
    """Runs cycles for one RayCluster. Not thread-safe: one caller at a time."""

    def __init__(self, kube: KubeAdapter, cache: ClusterCache, config: SidecarConfig,
                 metrics: SidecarMetrics | None = None, *, clock: Callable[[], float] = time.time,
                 read_ray: Callable[..., RayView] | None = None,
                 read_jobs: Callable[[str], dict[str, bool] | None] | None = None,
                 before_apply: BeforeApply | None = None, drain: Drain | None = None) -> None:
        if read_ray is None:
            from raygpu.adapters.ray_gcs import read_ray_view as read_ray
        if read_jobs is None:
            from raygpu.adapters.ray_gcs import read_job_liveness as read_jobs
        self.kube, self.cache, self.config = kube, cache, config
        self.metrics = metrics or SidecarMetrics()
        self.clock, self.read_ray, self.read_jobs = clock, read_ray, read_jobs
        self.before_apply = before_apply
        self.drain = drain or (lambda node_id, msg: drain_idle_node(config.ray_address, node_id, msg))
        self._drained = DrainMemory()  # drained by this process, deletion not yet seen to land
        self._seen_problems: set[tuple[str, str]] = set()
        self._last_decisions: dict[str, tuple[str, str]] = {}
        self._last_gc: dict[str, str] = {}
        self._draining: set[str] = set()  # reservations whose group is scaled to zero, pods still going
        self._gc_memory = GcMemory()  # what this process saw when, on its own clock
        self._cached: dict[str, ReservationRecord] = {}  # the cache's copy of each state ConfigMap, as planned on
        self._last_dry_run: tuple[str, ...] = ()
        self._last_cycle_s: float | None = None
        self._warm, self._cluster_policy = WarmKeeper(kube, self.metrics, self._event, self._ids), None
        self._scale_up = GangScaleUp(kube, self.metrics, self._event, self._ids,
                                     backoff_first_s=config.scale_up_backoff_s)
        self.health = HealthWatch(kube, self.metrics, self._event, self._ids)

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, once: bool = False) -> CycleReport | None:
        """Cycle until ``stop`` is set (checked between cycles); ``once``: one cycle, plus its re-plans.

        A conflict re-plans at once, at most MAX_IMMEDIATE_REPLANS times in a row,
        then waits the normal interval. Returns the last cycle's report.
        """
        report, replans = None, 0
        while not stop.is_set():
            report = self.cycle()
            if report.replan_now and replans < MAX_IMMEDIATE_REPLANS:
                replans += 1
                continue
            if once:
                break
            replans = 0
            stop.wait(self.config.interval_s)
        return report

    def cycle(self, before_apply: BeforeApply | None = None) -> CycleReport:
        """One snapshot -> plan -> apply. Never raises. ``before_apply(plan)`` runs just before the patch."""
        t0 = time.monotonic()
        try:
            report = self._cycle(before_apply or self.before_apply)
        except Exception as e:  # noqa: BLE001 - a cycle must never kill the loop
            log.exception("cycle-failed", extra={"fields": self._ids({"error": str(e)})})
            report = CycleReport(CycleOutcome.ERROR, error=f"{type(e).__name__}: {e}")
        report.duration_s = time.monotonic() - t0
        self.metrics.cycle_duration.observe(report.duration_s)
        self.metrics.cycles.labels(report.outcome.value).inc()
        plan = report.plan
        fields = {
            "outcome": report.outcome.value, "mode": report.mode.value if report.mode else None,
            "duration_s": round(report.duration_s, 3), "pods": len(plan.decisions) if plan else None,
            "to_delete": list(report.deleted_pods) if report.outcome is CycleOutcome.APPLIED
            else list(plan.deleted_pods) if plan else [],
            "reclaimable_gpus": plan.reclaimed_gpus if plan else 0.0,
            "released": list(report.released), "error": report.error}
        if report.reserved:
            fields["reserved"] = list(report.reserved)
        if plan is not None and plan.search_budget_spent:  # the budget rule (docs/reliability.md)
            fields["search_budget_spent"] = plan.search_budget_spent
        log.info("cycle", extra={"fields": self._ids(fields)})
        return report

    # ----------------------------------------------------------------- steps
    def _cycle(self, before_apply: BeforeApply | None) -> CycleReport:
        # 1. Observe Kubernetes from the watch cache (no LIST); reservations are thereby read before Ray.
        view = self.cache.view()
        unplannable = self._unplannable(view)
        if unplannable is not None:
            return unplannable
        cluster, now_s = view.cluster, self.clock()
        # 2. Policy from the annotations; bad values -> one Event each, and the safe default.
        mode, policy = self._policy(cluster)
        cp = self._cluster_policy
        assert cp is not None
        if mode is ReclaimMode.OFF and not cp.gang_scale_up:
            if self.health.due(cp, now_s):  # the health cycle runs whatever the reclaim mode
                cfg = self.config
                self.health.run(cluster, view.pods, self.read_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s,
                                                                  now_s=now_s), now_s)
            return CycleReport(CycleOutcome.OFF, mode=mode)
        # 3. Observe Ray: nodes and placement groups, then the job table; one state in.
        state = self._observe(view, cluster, policy, now_s)
        # 3b. Health, when due; the nodes marked unhealthy (as of the last health cycle) into the plan.
        if self.health.due(cp, now_s):
            self.health.run(cluster, view.pods, state.ray, now_s)
        if self.health.unhealthy:
            state = state.model_copy(update={"policy": state.policy.model_copy(
                update={"unhealthy_nodes": dict(self.health.unhealthy)})})
        self._scale_up.unhealthy_nodes = self.health.keep_off
        if mode is not ReclaimMode.OFF:
            state = self._warm.apply(state, cp)  # keep-warm
        # 4. Plan, purely: gang scale-up (its re-targets are what the GC judges), reservations to release, then
        # workers to remove; one plan out. The sidecar owns its process, so it pauses the cyclic collector for the
        # plan (plan/common/collector.py says why).
        with collector_paused():
            scale_up = None
            if cp.gang_scale_up:
                self._scale_up.observe(state.ray, now_s)
                scale_up = self._scale_up.plan(cluster, cp, state.ray, state.reservations, now_s)
                state = _retargeted(state, dict(scale_up.retarget))
            plan = plan_cycle(state)
        # 5. Report: decisions that changed, metrics. A dry run stops here.
        self._report(plan.reclaim, plan.gc, view, state.ray, mode, now_s)
        off = mode is ReclaimMode.OFF  # gang scale-up only: its own reservations are collected, nothing else
        report = CycleReport(CycleOutcome.IDLE, mode=mode, plan=None if off else plan.reclaim, gc=plan.gc)
        if off:
            self._gang_scale_up(report, scale_up, cluster, cp, state, now_s)
            return _concluded(report)
        if mode is ReclaimMode.DRY_RUN:  # no scale-down; a dead driver's reservation is still released
            self._gang_scale_up(report, scale_up, cluster, cp, state, now_s)
            return _concluded(self._dry_run(report, cluster))
        # 6. Apply the scale-down: one tested patch. A conflict or failure drops the plan, GC included.
        if plan.reclaim.to_delete and not self._scale_down(report, cluster, before_apply):
            return report
        # 7. Garbage-collect reservations nobody will release, one step each, never waiting; gang scale-up's
        # marks before it and its new reservations after it.
        self._gang_scale_up(report, scale_up, cluster, cp, state, now_s)
        # 8. The outcome: applied if anything was written, error if a release failed.
        return _concluded(report)

    def _gang_scale_up(self, report: CycleReport, scale_up: ScaleUpPlan | None, cluster: RayClusterView,
                       cp: ClusterPolicy, state: CycleState, now_s: float) -> None:
        """Step 7: gang scale-up's re-targets and ready marks, the garbage collection, then its reservations."""
        if scale_up is not None:
            self._scale_up.act_marks(scale_up, cluster, self._cached)
        only_scale_up = report.mode is ReclaimMode.OFF
        self._collect_garbage(report, cluster, state.ray, only_scale_up=only_scale_up)
        if scale_up is not None and scale_up.reserve:
            made = self._scale_up.act_reserve(scale_up, cluster, cp, now_s)
            report.reserved = tuple(made)

    def _unplannable(self, view: CacheView) -> CycleReport | None:
        """Step 1's verdict: a report when the cache cannot be planned from (not synced, no RayCluster)."""
        if not view.synced:
            return CycleReport(CycleOutcome.NOT_SYNCED, error="; ".join(view.errors) or "watch cache not synced yet")
        if view.cluster is None:
            cfg = self.config
            return CycleReport(CycleOutcome.NO_CLUSTER, error=f"RayCluster {cfg.namespace}/{cfg.cluster} not found")
        return None

    def _observe(self, view: CacheView, cluster: RayClusterView, policy: ReclaimPolicy, now_s: float) -> CycleState:
        """Step 3: Ray's view and job table, joined with the cached Kubernetes view into one state."""
        cfg, self._cached = self.config, {r.name: r for r in view.reservations}
        ray = self.read_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s, now_s=now_s)
        jobs = self.read_jobs(cfg.ray_address) if ray.reachable else None
        policy = policy.model_copy(update={"drained_pods": self._drained.current(view.pods, ray)})
        return CycleState(now_s=now_s, cluster=cluster, pods=view.pods, reservations=view.reservations, ray=ray,
                          jobs=jobs, policy=policy, heartbeat_timeout_s=cfg.heartbeat_timeout_s,
                          seen=self._gc_memory.seen_at(view.reservations, now_s),
                          orphan_groups=self._gc_memory.orphan_groups(cluster, view.reservations, now_s))

    def _dry_run(self, report: CycleReport, cluster: RayClusterView) -> CycleReport:
        """Step 5 in ``dry-run``: one ``ScaleDownDryRun`` Event per distinct plan; nothing is written."""
        plan, gc = report.plan, report.gc
        assert plan is not None and gc is not None
        if plan.deleted_pods and plan.deleted_pods != self._last_dry_run:
            self._event(cluster, "ScaleDownDryRun", "dry-run (raygpu.io/reclaim is not 'on'), would delete: "
                        + _pod_list(plan))
        self._last_dry_run = plan.deleted_pods
        if plan.to_delete or gc.to_release:
            report.outcome = CycleOutcome.DRY_RUN
        return report

    def _scale_down(self, report: CycleReport, cluster: RayClusterView, before_apply: BeforeApply | None) -> bool:
        """Step 6: send the plan's one tested patch. False (and the report says why) when it did not land."""
        plan = report.plan
        assert plan is not None
        if before_apply is not None:
            before_apply(plan)
        plan = report.plan = self._drain_first(plan)
        if not plan.to_delete:
            return True  # Ray refused every drain: nothing to patch; the GC goes on
        result = apply_reclaim(self.kube, plan)
        fields = self._ids({"resource_version": plan.cluster_resource_version, "pods": list(plan.deleted_pods),
                            "status": result.status.value, "error": result.error})
        log.info("patch", extra={"fields": fields})
        if result.status is ApplyStatus.CONFLICT:
            self.metrics.patch_conflicts.inc()
            self.cache.wait_cluster_change(plan.cluster_resource_version, CONFLICT_WAIT_S)
            report.outcome, report.error = CycleOutcome.CONFLICT, result.error
            return False  # the plan is dropped; GC waits for the re-plan too
        if result.status is ApplyStatus.FAILED:
            report.outcome, report.error = CycleOutcome.ERROR, result.error
            return False
        assert result.cluster is not None
        self.cache.assume_cluster(result.cluster, plan.cluster_resource_version)
        report.outcome, report.deleted_pods = CycleOutcome.APPLIED, plan.deleted_pods
        self.metrics.gpus_reclaimed.inc(plan.reclaimed_gpus)
        self.metrics.workers_deleted.inc(len(plan.deleted_pods))
        for g in plan.to_delete:
            reasons = "; ".join(f"{d.pod_name} ({d.reason.value}: {d.detail})"
                                for d in plan.decisions if d.pod_name in g.added)
            self._event(cluster, "ScaledDown", f"worker group {g.group_name}: replicas {g.old_replicas} -> "
                        f"{g.replicas}, deleting {len(g.added)}: {reasons}")
        return True

    def _drain_first(self, plan: ReclaimPlan) -> ReclaimPlan:
        """Step 6a: Ray drains each worker to delete (``raygpu.reclaim.drain``); the plan without those it refused."""
        cfg = self.config
        result = drain_workers(plan, self.drain, lambda: self.read_ray(cfg.ray_address, timeout_s=cfg.ray_timeout_s,
                                                                   now_s=self.clock()))
        self._drained.remember(result.drained)
        for pod, node_id in result.drained.items():
            self.metrics.drains.labels("accepted").inc()
            log.info("drained", extra={"fields": self._ids({"pod": pod, "ray_node": node_id})})
        for pod, why in result.rejected.items():
            self.metrics.drains.labels("rejected").inc()
            log.info("drain-rejected", extra={"fields": self._ids({"pod": pod, "detail": why})})
        return result.plan

    def _collect_garbage(self, report: CycleReport, cluster: RayClusterView, ray: RayView | None = None, *,
                         only_scale_up: bool = False) -> None:
        """Step 7: one release step per reservation of the GC plan, each reported as it lands.

        A gang scale-up reservation's Ray nodes are drained first (Ray refuses a node that holds a bundle or a
        task: the release waits for the next cycle), so a placement group Ray placed on them since the plan
        was made is never killed. ``only_scale_up``: release gang scale-up reservations only (reclaim off)."""
        assert report.gc is not None
        released = []
        for d in report.gc.to_release:
            record = self._cached.get(d.reservation)
            by_scale_up = record is not None and record.by_scale_up
            if only_scale_up and not by_scale_up:
                continue
            if by_scale_up and ray is not None and d.group_owned and (why := self._drain_group(d.group, ray)):
                log.info("release-deferred", extra={"fields": self._ids({"reservation": d.reservation, "why": why})})
                continue
            if d.reason in NEEDS_LIVE_READ and (why := confirm_release(self.kube, cluster.namespace, d, self._cached.get(
                    d.reservation), self._gc_memory.seen, self.clock())):  # the cache may be stale: one live read first
                log.info("release-deferred", extra={"fields": self._ids({"reservation": d.reservation, "why": why})})
                continue
            result = apply_release(self.kube, cluster.namespace, cluster.name, d)
            if result.status is ReleaseStatus.FAILED:
                report.errors.append(f"release {d.reservation}: {result.error}")
                log.warning("release-failed", extra={"fields": self._ids({"reservation": d.reservation,
                                                                          "error": result.error})})
                continue
            if result.status is ReleaseStatus.DRAINING:  # never block a cycle: the next one finishes it
                if d.reservation not in self._draining:
                    self._draining.add(d.reservation)
                    log.info("draining", extra={"fields": self._ids({
                        "reservation": d.reservation, "group": d.group, "reason": d.reason.value})})
                continue
            self._draining.discard(d.reservation)
            log.info(result.status.value, extra={"fields": self._ids({
                "reservation": d.reservation, "group": d.group, "reason": d.reason.value, "detail": d.detail,
                "group_removed": result.group_removed, "configmap_deleted": result.configmap_deleted})})
            if result.status in (ReleaseStatus.RELEASED, ReleaseStatus.SCALED_TO_ZERO):  # else done before
                released.append(d.reservation)
                if by_scale_up and d.reason in (GcReason.TIMED_OUT, GcReason.INCOMPLETE) and record is not None:
                    self._scale_up.failed(record.placement_group_id, self.clock())  # retried after a back-off
                self.metrics.reservations_released.labels(d.reason.value).inc()
                if result.status is ReleaseStatus.RELEASED:
                    self._event(cluster, "ReservationReleased", f"reservation {d.reservation} (worker group "
                                f"{d.group}) released: {d.reason.value}: {d.detail}")
                else:
                    self._event(cluster, "ReservationScaledToZero", f"worker group {d.group}: {d.reason.value}: "
                                f"{d.detail}; the group stays for a human to remove", type_="Warning")
        report.released = tuple(released)

    def _drain_group(self, group: str, ray: RayView) -> str:
        """Ask Ray to drain every alive node of reservation group ``group``; why the release must wait ('' when
        every node was drained or none is left)."""
        for n in ray.nodes:
            if not n.alive or n.draining or n.reservation_group != group:
                continue
            ok, why = self.drain(n.node_id, f"raygpu: releasing gang scale-up reservation group {group}")
            self.metrics.drains.labels("accepted" if ok else "rejected").inc()
            if not ok:
                return f"Ray refused to drain node {n.node_id} of {group}: {why}"
        return ""

    def _policy(self, cluster: RayClusterView) -> tuple[ReclaimMode, ReclaimPolicy]:
        cp, problems = parse_cluster_policy(cluster.annotations)
        self._cluster_policy = cp
        for pr in problems:
            key = (pr.key, pr.value)
            if key in self._seen_problems:
                continue
            log.warning("invalid-annotation", extra={"fields": self._ids({
                "key": pr.key, "value": pr.value, "reason": pr.reason, "default_used": pr.default_used})})
            if self._event(cluster, "InvalidAnnotation", f"{pr.key}={pr.value!r} ignored: {pr.reason}; "
                           f"using {pr.default_used}", type_="Warning"):
                self._seen_problems.add(key)
                self.metrics.invalid_annotations.inc()
        mode = ReclaimMode(cp.reclaim.value)
        if any(pr.key == KEY_RECLAIM for pr in problems):
            mode = ReclaimMode.DRY_RUN  # the safe default, whatever the parser's default is
        return mode, ReclaimPolicy(idle_timeout_s=cp.idle_timeout_s, group_idle_timeout_s=cp.group_idle_timeout_s,
                                   startup_grace_s=self.config.startup_grace_s, mode=mode)

    def _report(self, plan: ReclaimPlan, gc: GcPlan, view: CacheView, ray: RayView, mode: ReclaimMode,
                now_s: float) -> None:
        m = self.metrics
        for d in plan.decisions:
            m.decisions.labels(d.action.value, d.reason.value).inc()
            sig = (d.action.value, d.reason.value)
            if self._last_decisions.get(d.pod_name) != sig:  # a repeated verdict is in the cycle line
                log.info("decision", extra={"fields": self._ids({
                    "mode": mode.value, "pod": d.pod_name, "group": d.group, "action": d.action.value,
                    "reason": d.reason.value, "detail": d.detail, "gpus": d.gpus,
                    "idle_for_s": None if d.idle_for_s is None else round(d.idle_for_s, 1),
                    "k8s_node": d.k8s_node_name, "ray_node": d.ray_node_id})})
        self._last_decisions = {d.pod_name: (d.action.value, d.reason.value) for d in plan.decisions}
        for d in gc.decisions:
            if d.action is not GcAction.KEEP or self._last_gc.get(d.reservation) != d.reason.value:
                log.info("gc-decision", extra={"fields": self._ids({
                    "mode": mode.value, "reservation": d.reservation, "group": d.group, "action": d.action.value,
                    "reason": d.reason.value, "detail": d.detail})})
        self._last_gc = {d.reservation: d.reason.value for d in gc.decisions}
        pods = {p.name for p in view.pods if not p.is_head}
        idle_gpus = sum(n.gpu_total for n in ray.nodes
                        if n.alive and not n.is_head and n.instance_id in pods and n.idle_since_s is not None)
        m.idle_gpus.set(idle_gpus)
        m.set_guard(guard_gauges(view.reservations, self._gc_memory.first_seen_s(), now_s))
        m.reclaimable_gpus.set(plan.reclaimed_gpus)
        if plan.search_budget_spent:  # every idle worker a pending bundle could use was kept
            m.search_budget_spent.inc()
            log.warning("search-budget-spent", extra={"fields": self._ids({
                "mode": mode.value, "detail": plan.search_budget_spent})})
        if self._last_cycle_s is not None and now_s > self._last_cycle_s:
            dt_s = min(now_s - self._last_cycle_s, 5 * self.config.interval_s + self.config.ray_timeout_s)
            m.idle_gpu_seconds.inc(idle_gpus * dt_s)
        self._last_cycle_s = now_s

    def _event(self, cluster: RayClusterView, reason: str, message: str, type_: str = "Normal") -> bool:
        """Record an Event on the RayCluster; False only when it failed and is worth retrying."""
        involved = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster.name,
                    "namespace": cluster.namespace, "uid": cluster.uid}
        try:
            self.kube.event(involved, reason, message, type_=type_, component="raygpu-sidecar")
            return True
        except RayGpuError as e:
            log.warning("event-failed", extra={"fields": self._ids({"reason": reason, "error": str(e)})})
            return not isinstance(e, TransientError)

    def _ids(self, fields: dict) -> dict:
        return {"namespace": self.config.namespace, "cluster": self.config.cluster, **fields}


def problem_reporter(kube: KubeAdapter, namespace: str, cluster: str) -> Callable[[str], None]:
    """The watch cache's ``on_problem`` for one RayCluster: a warning log line ``invalid-spec`` and a Warning
    Event ``InvalidSpec`` on the RayCluster naming the problem.

    The returned function never raises: a RayCluster that is gone gets no Event, and a failed Event write
    (any ``RayGpuError``) is one ``event-failed`` log line; the cache and the cycle go on.
    """
    def report(message: str) -> None:
        log.warning("invalid-spec", extra={"fields": {"namespace": namespace, "cluster": cluster, "problem": message}})
        try:
            rc = kube.get("ray.io/v1", "RayCluster", cluster, namespace)  # the Event needs its uid
            if rc is None:
                return
            involved = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "namespace": namespace,
                        "uid": rc["metadata"].get("uid", "")}
            kube.event(involved, "InvalidSpec", message, type_="Warning", component="raygpu-sidecar")
        except RayGpuError as e:
            log.warning("event-failed", extra={"fields": {"reason": "InvalidSpec", "error": str(e)}})
    return report


def _retargeted(state: CycleState, retarget: dict[str, str]) -> CycleState:
    """``state`` with gang scale-up's re-targets applied to its records (the GC judges what will be written; a
    re-target that then fails to land only makes the GC keep what it would have kept anyway)."""
    if not retarget:
        return state
    records = tuple(r.model_copy(update={"placement_group_id": retarget[r.name]}) if r.name in retarget else r
                    for r in state.reservations)
    return state.model_copy(update={"reservations": records})


def _concluded(report: CycleReport) -> CycleReport:
    """Step 8: a cycle that released something applied; one whose releases failed (and did nothing else) erred."""
    if report.released or report.reserved:
        report.outcome = CycleOutcome.APPLIED
    if report.errors and report.outcome is CycleOutcome.IDLE:
        report.outcome, report.error = CycleOutcome.ERROR, "; ".join(report.errors)
    return report


def _pod_list(plan: ReclaimPlan) -> str:
    return "; ".join(f"{d.pod_name} ({d.reason.value}: {d.detail})" for d in plan.decisions
                     if d.action is DecisionAction.DELETE)
