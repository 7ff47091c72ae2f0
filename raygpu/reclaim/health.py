"""The sidecar's health cycle: the doctor's checks for its RayCluster every ``raygpu.io/doctor-interval``.

Off by default. When due (the first cycle with the annotation set, then once per interval on the sidecar's
clock), in order:

1. read the Kubernetes nodes (one LIST; the sidecar's pods come from its watch cache, Ray's view from the cycle);
   a refused list (no ``deploy/sidecar-doctor`` permission) is said once in the log and the cycle is skipped;
2. ``reconcile`` the snapshot (the doctor's pure function, NVML excepted: the sidecar starts no probe task)
   and keep the findings about this RayCluster (its pods, its Ray nodes, the nodes its pods run on);
3. export them: the gauge ``raygpu_doctor_findings{check,severity}`` and one Warning Event ``DoctorFinding``
   on the RayCluster per finding when it first appears (deduplicated by kind and subject; a finding that goes
   and comes back is told again);
4. keep ``unhealthy``: every node a health agent marked (``plan.common.health.unhealthy_nodes``), which the
   reclaimer's plan and gang scale-up's reservations steer around until the next health cycle.

Never raises: a failure is a log line and the last result stays.
"""

from __future__ import annotations

import logging
from typing import Callable

from raygpu.adapters.kube import KubeAdapter, node_view, parse_each
from raygpu.errors import ForbiddenError, RayGpuError
from raygpu.model.annotations import ClusterPolicy
from raygpu.model.findings import DoctorReport, Finding, FindingKind, Severity
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sPodView, K8sView, RayView, Snapshot
from raygpu.plan.common.health import unhealthy_nodes
from raygpu.plan.doctor.reconcile import reconcile
from raygpu.plan.gang.free import unhealthy_node_names
from raygpu.reclaim.metrics import SidecarMetrics

log = logging.getLogger("raygpu.sidecar")

EVENT_REASON = "DoctorFinding"
_MAX_EVENT_CHARS = 1000


class HealthWatch:
    """Runs the doctor's checks when due and remembers what it found. Not thread-safe (the cycle's thread)."""

    def __init__(self, kube: KubeAdapter, metrics: SidecarMetrics,
                 event: Callable[..., bool], ids: Callable[[dict], dict]) -> None:
        self.kube, self.metrics, self._event, self._ids = kube, metrics, event, ids
        self.unhealthy: dict[str, str] = {}  # node -> why, as of the last health cycle
        self.keep_off: tuple[str, ...] = ()  # of those, the nodes a pod of this cluster's groups may use
        self.last_report: DoctorReport | None = None
        self._last_run_s: float | None = None
        self._told: set[tuple[str, str]] = set()  # (kind, subject) of the findings already told by an Event
        self._refused = False

    def due(self, policy: ClusterPolicy, now_s: float) -> bool:
        interval = policy.doctor_interval_s
        if interval is None:
            if self.unhealthy or self._last_run_s is not None:  # turned off: forget, steer around nothing
                self.unhealthy, self.keep_off, self._last_run_s, self._told = {}, (), None, set()
            return False
        return self._last_run_s is None or now_s - self._last_run_s >= interval

    def run(self, cluster: RayClusterView, pods: tuple[K8sPodView, ...], ray: RayView, now_s: float) -> None:
        """One health cycle (steps 1-4 above). Never raises."""
        self._last_run_s = now_s
        try:
            nodes = parse_each(self.kube.list("v1", "Node"), node_view, "Node")
        except ForbiddenError as e:
            if not self._refused:
                log.warning("doctor-nodes-refused", extra={"fields": self._ids({
                    "error": str(e), "fix": "apply deploy/sidecar-doctor (chart: doctor.enabled) to let the "
                                            "sidecar list nodes"})})
                self._refused = True
            return
        except RayGpuError as e:
            log.warning("doctor-nodes-failed", extra={"fields": self._ids({"error": str(e)})})
            return
        self._refused = False
        snapshot = Snapshot(taken_at_s=now_s, cluster=cluster.name, namespace=cluster.namespace, ray=ray,
                            k8s=K8sView(nodes=tuple(nodes), pods=pods))
        report = reconcile(snapshot, now_s)
        mine = {p.node_name for p in pods if p.node_name}
        findings = [f for f in report.findings if f.node is None or f.node in mine]
        self.last_report = report
        self.unhealthy = {n: "; ".join(why) for n, why in unhealthy_nodes(snapshot).items()}
        self.keep_off = unhealthy_node_names(nodes, cluster)
        counts: dict[tuple[str, str], int] = {}
        for f in findings:
            key = (f.kind.value, f.severity.value)
            counts[key] = counts.get(key, 0) + 1
        self.metrics.set_doctor_findings(counts, (k.value for k in FindingKind), [s.value for s in Severity])
        now_keys = {(f.kind.value, f.subject) for f in findings}
        blast = {b.subject: b for b in report.blast_radius}
        for f in findings:
            key = (f.kind.value, f.subject)
            if key in self._told:
                continue
            if self._event(cluster, EVENT_REASON, _event_message(f, blast.get(f.subject)), type_="Warning"):
                self._told.add(key)
        self._told &= now_keys  # gone: told again if it comes back
        log.info("doctor", extra={"fields": self._ids({
            "findings": len(findings), "unhealthy_nodes": sorted(self.unhealthy),
            "kinds": sorted({f.kind.value for f in findings})})})


def _event_message(f: Finding, blast) -> str:
    text = f"{f.severity.value} {f.layer.value} {f.kind.value} {f.subject}: {f.message}."
    if blast is not None and blast.ray_nodes:
        parts = []
        if blast.placement_groups:
            parts.append("placement groups " + ", ".join(p.pg_id for p in blast.placement_groups))
        if blast.jobs:
            parts.append("jobs " + ", ".join(blast.jobs))
        if blast.reservations:
            parts.append("reservations " + ", ".join(blast.reservations))
        text += " On it: " + ("; ".join(parts) if parts else f"{len(blast.ray_nodes)} Ray node(s), no placement group") + "."
    text += f" Fix: {f.remedy}"
    return text if len(text) <= _MAX_EVENT_CHARS else text[:_MAX_EVENT_CHARS - 3] + "..."
