"""Apply the doctor's repair plan (``raygpu.io/reconcile: repair``): one tested patch, one Event per action.

``raygpu.plan.doctor.repair.plan_repair`` decides; this module only writes:

1. read the RayCluster, plan from the report and the snapshot's pods;
2. send the plan's single JSON patch (first op: ``test`` on
   ``metadata.resourceVersion``). On ``ConflictError`` someone else wrote the
   RayCluster in between: observe again (a fresh snapshot and report, since
   the orphan may have recovered), re-read, re-plan, and try again, at most
   ``attempts`` times. Nothing is ever overwritten;
3. record every applied action as a Kubernetes Event ``RepairedOrphanPod`` on
   the RayCluster.

Errors come back as values in :class:`RepairOutcome` (the doctor still prints
its report); only bugs raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raygpu.errors import ConflictError, RayGpuError
from raygpu.model.findings import DoctorReport
from raygpu.model.views import Snapshot
from raygpu.plan.doctor.repair import EVENT_REASON, RepairPlan, plan_repair

Observe = Callable[[], tuple[DoctorReport, Snapshot]]


@dataclass
class RepairOutcome:
    plan: RepairPlan | None = None  # the last plan made (the applied one when applied)
    applied: bool = False
    conflicts: int = 0  # resourceVersion tests that failed (each one re-planned)
    events: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "conflicts": self.conflicts, "events": self.events, "errors": self.errors,
                "plan": self.plan.model_dump(mode="json") if self.plan else None}

    def lines(self) -> list[str]:
        """Human-readable summary for ``raygpu doctor``."""
        out = []
        p = self.plan
        if p is not None:
            for a in p.actions:
                verb = "repaired" if self.applied else "would repair"
                out.append(f"{verb}: pod {a.pod} (group {a.group}) -> workersToDelete, "
                           f"replicas {a.replicas_before} -> {a.replicas_after}")
            out += [f"left alone: {s.subject}: {s.reason}" for s in p.skipped]
            if p.empty and not p.skipped:
                out.append("nothing to repair")
        if self.conflicts:
            out.append(f"the RayCluster changed under the repair {self.conflicts} time(s); re-planned each time")
        if self.applied:
            out.append(f"{self.events} Event(s) {EVENT_REASON} recorded on RayCluster {p.namespace}/{p.cluster}")
        out += [f"repair error: {e}" for e in self.errors]
        return out


def repair_cluster(kube: Any, namespace: str, cluster: str, report: DoctorReport, snapshot: Snapshot,
                   observe: Observe | None = None, attempts: int = 3) -> RepairOutcome:
    """Plan and apply the safe repairs for ``report``; re-observe and re-plan on a conflict.

    ``kube``: a ``KubeAdapter`` (``get_raycluster``, ``patch_raycluster``, ``event``).
    ``observe``: takes a fresh snapshot and report after a conflict; without it
    the first report is re-planned against the re-read RayCluster.
    """
    out = RepairOutcome()
    for attempt in range(attempts):
        if attempt and observe is not None:
            try:
                report, snapshot = observe()
            except RayGpuError as e:
                out.errors.append(f"re-observing after a conflict failed: {e}")
                return out
        try:
            view = kube.get_raycluster(namespace, cluster)
        except RayGpuError as e:
            out.errors.append(str(e))
            return out
        out.plan = plan = plan_repair(report, view, snapshot)
        if plan.patch is None:
            return out
        try:
            kube.patch_raycluster(namespace, cluster, [dict(op) for op in plan.patch])
        except ConflictError:
            out.conflicts += 1
            continue
        except RayGpuError as e:
            out.errors.append(str(e))
            return out
        out.applied = True
        involved = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": view.name,
                    "namespace": view.namespace, "uid": view.uid}
        for action in plan.actions:
            try:
                kube.event(involved, EVENT_REASON, action.event_message)
                out.events += 1
            except RayGpuError as e:
                out.errors.append(f"event for {action.pod}: {e}")
        return out
    out.errors.append(f"gave up after {attempts} conflicting writes; nothing was overwritten, rerun to retry")
    return out
