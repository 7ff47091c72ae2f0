"""Gang scale-up in the sidecar: a gang reservation per pending placement group raygpu did not create.

Ray Train, Tune, Serve and vLLM create their own placement groups; Ray's autoscaler turns them into pod
scale-ups one pod at a time, so two such jobs can half-place each other. With ``raygpu.io/gang-scale-up: on``
the sidecar does for each such placement group what ``raygpu.placement_group()`` does for its own: one
all-or-nothing reservation on the cluster's ``raygpu.io/gang-backend`` (docs/gang-scale-up.md). The pods
become Ray nodes together, and Ray places the pending group on them.

Each cycle: ``GangScaleUp.observe`` updates what this process remembers (when it first saw each placement
group pending; which are backing off), ``raygpu.plan.scale_up.plan_scale_up`` decides (pure), and
``act_marks`` / ``act_reserve`` write: re-targets and ``ready`` marks first (before the garbage collector
acts on the same view), reservations last. A reservation is made as ``raygpu.gang.reservation.reserve``
makes one (``plan_reserve`` -> ``act_reserve``: state ConfigMap, gang objects, one tested RayCluster
patch), with the placement group on the state ConfigMap from its creation; a failure rolls back what was
created without waiting (the garbage collector finishes a drain) and backs the placement group off.
Releases are the garbage collector's (``raygpu.plan.reclaim.gc``: its placement group gone, placed
elsewhere, or still pending at the deadline). Nothing here raises: errors are log lines, Events and metrics.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Callable

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError, PermanentError, RayGpuError
from raygpu.gang.backends import get_backend
from raygpu.gang.backends.workload import GROUP as WORKLOAD_GROUP
from raygpu.gang.reservation import act_reserve
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.gang import Backend, ReservationState, check_transition
from raygpu.model.gc import ReservationRecord
from raygpu.model.guard import GuardPolicy
from raygpu.model.labels import ANNOTATION_PLACEMENT_GROUP, ANNOTATION_RESERVATION_STATE
from raygpu.model.raycluster import RayClusterView
from raygpu.model.scale_up import ScaleUpItem, ScaleUpPlan
from raygpu.model.views import PgState, RayView
from raygpu.plan.gang.reserve import ReserveSnapshot, plan_reserve
from raygpu.plan.scale_up import autoscaler_risks, plan_scale_up
from raygpu.reclaim.metrics import SidecarMetrics

log = logging.getLogger("raygpu.sidecar")

BACKOFF_FIRST_S = 30.0  # after a placement group's first failed or timed-out reservation
BACKOFF_MAX_S = 600.0  # doubling up to this
_STEPS = (ReservationState.RESERVED, ReservationState.ADMITTED, ReservationState.BOUND, ReservationState.READY)

_DIGITS = re.compile(r"[0-9.]+")
Event = Callable[[RayClusterView, str, str, str], bool]  # (cluster, reason, message, type) -> written


class GangScaleUp:
    """What one sidecar remembers for gang scale-up, on its own clock, and its writes. Not thread-safe."""

    def __init__(self, kube: KubeAdapter, metrics: SidecarMetrics, event: Event,
                 ids: Callable[[dict], dict], *, backoff_first_s: float = BACKOFF_FIRST_S) -> None:
        self.kube, self.metrics, self._event, self._ids = kube, metrics, event, ids
        self.backoff_first_s = backoff_first_s
        self.first_seen: dict[str, float] = {}  # placement group id -> when this process first saw it pending
        self.backoff_until: dict[str, float] = {}  # placement group id -> no reservation before then
        self._failures: dict[str, int] = {}  # placement group id -> failed or timed-out reservations in a row
        self._said: dict[str, str] = {}  # placement group id -> the last reason said for it (said once)
        self._risks_said: tuple = ()  # the autoscaler risk last said (an Event when it changes)
        self.unhealthy_nodes: tuple[str, ...] = ()  # set by the cycle from its health watch: reservations avoid them

    # ------------------------------------------------------------------ observe
    def observe(self, ray: RayView, now_s: float) -> None:
        """Remember when each pending placement group was first seen; forget the ones no longer pending."""
        if not ray.reachable:
            return  # nothing known: keep what we remember
        pending = {pg.pg_id for pg in ray.placement_groups if pg.state is PgState.PENDING}
        for pg_id in pending:
            self.first_seen.setdefault(pg_id, now_s)
        for memory in (self.first_seen, self.backoff_until, self._failures, self._said):
            for pg_id in [k for k in memory if k not in pending]:
                del memory[pg_id]

    def plan(self, cluster: RayClusterView, policy: ClusterPolicy, ray: RayView,
             reservations: tuple[ReservationRecord, ...], now_s: float) -> ScaleUpPlan:
        risks = tuple(autoscaler_risks(cluster))
        if risks and risks != self._risks_said:
            groups = ", ".join(f"{g} (maxReplicas {n})" for g, n in risks)
            log.warning("scale-up-beside-autoscaler", extra={"fields": self._ids({"groups": groups})})
            if self._event(cluster, "GangScaleUpBesideAutoscaler", f"enableInTreeAutoscaling is on and GPU worker "
                           f"group(s) {groups} can grow by 2 pods or more: Ray's autoscaler may scale them pod by "
                           "pod for a placement group and half-place it. Set maxReplicas: 0 on GPU templates "
                           "(gang scale-up copies them) and keep at most one single-GPU group of maxReplicas: 1 "
                           "(docs/gang-scale-up.md)", "Warning"):
                self._risks_said = risks
        elif not risks:
            self._risks_said = ()
        plan = plan_scale_up(cluster, policy, ray, reservations, now_s, first_seen=self.first_seen,
                             backoff_until=self.backoff_until)
        waiting = {pg for pg, _ in plan.waiting}
        not_reserved = waiting | {i.pg_id for i in plan.reserve}  # one set, not one per placement group
        self.metrics.scale_up_pending.labels("waiting").set(len(waiting))
        self.metrics.scale_up_pending.labels("reserved").set(sum(
            1 for pg in ray.placement_groups if pg.state is PgState.PENDING and pg.pg_id not in not_reserved))
        for pg_id, why in plan.waiting:
            kind = _DIGITS.sub("", why)  # said again only when the reason changes, not its numbers
            if self._said.get(pg_id) != kind:
                self._said[pg_id] = kind
                log.info("scale-up-waiting", extra={"fields": self._ids({"placement_group": pg_id, "why": why})})
        if plan.budget_spent:
            log.warning("scale-up-budget-spent", extra={"fields": self._ids({"detail": plan.budget_spent})})
        return plan

    def failed(self, pg_id: str | None, now_s: float) -> None:
        """A reservation for ``pg_id`` failed or timed out: no new one for 30 s, doubling up to 10 min."""
        if not pg_id:
            return
        n = self._failures[pg_id] = self._failures.get(pg_id, 0) + 1
        self.backoff_until[pg_id] = now_s + min(BACKOFF_MAX_S, self.backoff_first_s * 2 ** min(n - 1, 20))

    # ---------------------------------------------------------------------- act
    def act_marks(self, plan: ScaleUpPlan, cluster: RayClusterView,
                  records: dict[str, ReservationRecord]) -> None:
        """Re-target reservations and mark the used ones ready (merge patches on their state ConfigMaps)."""
        ns = cluster.namespace
        for name, pg_id in plan.retarget:
            try:
                self.kube.merge_patch("v1", "ConfigMap", name, ns,
                                      {"metadata": {"annotations": {ANNOTATION_PLACEMENT_GROUP: pg_id}}})
                log.info("scale-up-retarget", extra={"fields": self._ids({"reservation": name, "placement_group": pg_id})})
            except RayGpuError as e:
                log.warning("scale-up-retarget-failed", extra={"fields": self._ids({"reservation": name,
                                                                                     "error": str(e)})})
        for name, pg_id in plan.ready:
            record = records.get(name)
            if record is None:
                continue
            try:
                state = ReservationState(record.state or "")
                for target in _STEPS[_STEPS.index(state) + 1:] if state in _STEPS else ():
                    check_transition(state, target)
                    self.kube.merge_patch("v1", "ConfigMap", name, ns,
                                          {"metadata": {"annotations": {ANNOTATION_RESERVATION_STATE: target.value}}})
                    state = target
                log.info("scale-up-ready", extra={"fields": self._ids({"reservation": name, "placement_group": pg_id})})
            except (ValueError, RayGpuError) as e:
                log.warning("scale-up-ready-failed", extra={"fields": self._ids({"reservation": name,
                                                                                  "error": str(e)})})

    def act_reserve(self, plan: ScaleUpPlan, cluster: RayClusterView, policy: ClusterPolicy, now_s: float) -> list[str]:
        """Make the plan's reservations, oldest placement group first; returns the names made."""
        made = []
        for item in plan.reserve:
            if self._reserve(item, cluster, policy, now_s):
                made.append(item.request.name)
        return made

    def _reserve(self, item: ScaleUpItem, cluster: RayClusterView, policy: ClusterPolicy, now_s: float) -> bool:
        fields = {"placement_group": item.pg_id, "reservation": item.request.name}
        try:
            backend = item.request.backend or policy.gang_backend
            builder = get_backend(backend, served=self.kube.api_group_kinds(WORKLOAD_GROUP)
                                  if backend is Backend.WORKLOAD else None)
            if item.template is not None:  # the group the bundles' label selectors allow (plan.scale_up)
                policy = policy.model_copy(update={"gang_template": item.template})
            snap = ReserveSnapshot(request=item.request, cluster=cluster, policy=policy, free=None,
                                   guard_policy=GuardPolicy(), backend=builder, now_s=now_s,
                                   request_id=uuid.uuid4().hex, scale_up_pg=item.pg_id,
                                   unhealthy_nodes=self.unhealthy_nodes)
            plan = plan_reserve(snap)  # InfeasibleError / PermanentError: nothing was written
        except PermanentError as e:
            return self._give_up(cluster, item, now_s, fields, "refused", e, (
                "GangScaleUpRefused", f"placement group {item.pg_id}: no gang reservation can be planned: {e}"))
        except RayGpuError as e:
            return self._give_up(cluster, item, now_s, fields, "failed", e)
        try:
            rsv = act_reserve(self.kube, snap, plan, lambda m: log.info("scale-up-progress", extra={
                "fields": self._ids({**fields, "detail": m})}), rollback_drain_s=0.0)
        except ConflictError as e:
            if self._exists(plan.state_configmap):
                self.metrics.scale_up_reservations.labels("exists").inc()
                log.info("scale-up-exists", extra={"fields": self._ids({**fields, "detail": str(e)})})
                return False
            return self._give_up(cluster, item, now_s, fields, "failed", e)
        except RayGpuError as e:
            return self._give_up(cluster, item, now_s, fields, "failed", e, (
                "GangScaleUpFailed", f"placement group {item.pg_id}: the gang reservation {item.request.name} "
                f"failed and was rolled back: {e}"))
        self.metrics.scale_up_reservations.labels("reserved").inc()
        gang = rsv.plan
        log.info("scale-up-reserved", extra={"fields": self._ids({
            **fields, "group": gang.reservation_group, "pods": gang.pod_count, "backend": gang.backend.value})})
        self._event(cluster, "GangScaleUp", f"placement group {item.pg_id} ({len(item.request.bundles)} bundles, "
                    f"{item.request.strategy.value}): worker group {gang.reservation_group} x{gang.pod_count}, "
                    f"backend {gang.backend.value}: {gang.reason[:300]}", "Normal")
        return True

    def _give_up(self, cluster: RayClusterView, item: ScaleUpItem, now_s: float, fields: dict, result: str,
                 error: RayGpuError, say: tuple[str, str] | None = None) -> bool:
        """One attempt for ``item`` ended without a reservation (``result``: refused or failed): counted, backed
        off, logged as ``scale-up-<result>``, and with ``say`` (reason, message) a Warning Event once."""
        self.metrics.scale_up_reservations.labels(result).inc()
        self.failed(item.pg_id, now_s)
        log.warning(f"scale-up-{result}", extra={"fields": self._ids({**fields, "error": str(error)})})
        if say is not None:
            self._say(cluster, item.pg_id, *say)
        return False

    def _exists(self, state_configmap: dict) -> bool:
        """Whether the state ConfigMap of this name exists (made by an earlier cycle or process): best effort."""
        md = state_configmap["metadata"]
        try:
            return self.kube.get("v1", "ConfigMap", md["name"], md["namespace"]) is not None
        except RayGpuError:
            return False

    def _say(self, cluster: RayClusterView, pg_id: str, reason: str, message: str) -> None:
        """A Warning Event, once per placement group and reason."""
        if self._said.get(pg_id) == reason:
            return
        if self._event(cluster, reason, message, "Warning"):
            self._said[pg_id] = reason


__all__ = ["GangScaleUp", "BACKOFF_FIRST_S", "BACKOFF_MAX_S"]
