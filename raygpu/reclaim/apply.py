"""Applying the sidecar's plans: one tested JSON patch per RayCluster, and reservation releases.

``reclaim_patch`` is pure (plan in, RFC 6902 ops out); ``apply_reclaim`` and
``release_reservation`` do the writes through ``KubeAdapter`` and reuse the gang
module's release code; ``apply_release`` is the garbage collector's step for
one reservation, its outcome a value (``ReleaseResult``), never an exception.

Why applying twice deletes nothing twice: the patch starts with a ``test`` on
the resourceVersion the plan was made from, so a stale plan never lands; and a
plan made after a landed patch sees its pods in ``workersToDelete`` (reason
``AlreadyDeleting``) and never lists them again. A sidecar killed between the
patch and its Event therefore finds the deletion done, not to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import ConflictError, RayGpuError
from raygpu.gang.reservation import GROUP_DRAINING, GROUP_REMOVED, finish_release
from raygpu.model.gc import GcDecision
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPlan
from raygpu.plan.patch import guard_group_name, raycluster_patch, set_replicas, set_workers_to_delete


def reclaim_patch(plan: ReclaimPlan) -> list[dict]:
    """The one JSON patch that applies ``plan``.

    ``[test resourceVersion]`` then, per shrinking group: test its ``groupName``
    and its ``replicas`` (the values the plan saw), set ``replicas``, set
    ``scaleStrategy.workersToDelete`` to the full new list (names kept once, in
    order). Raises PermanentError for a plan without a resourceVersion or without
    deletions (nothing to apply is the caller's case to skip).
    """
    ops: list[dict] = []
    for g in plan.to_delete:
        ops += guard_group_name(g.group_index, g.group_name)
        ops.append({"op": "test", "path": f"/spec/workerGroupSpecs/{g.group_index}/replicas", "value": g.old_replicas})
        ops += set_replicas(g.group_index, g.replicas)
        ops += set_workers_to_delete(g.group_index, list(dict.fromkeys(g.workers_to_delete)))
    return raycluster_patch(plan.cluster_resource_version, ops)


class ApplyStatus(str, Enum):
    APPLIED = "applied"
    CONFLICT = "conflict"  # the RayCluster changed since the snapshot: re-plan, never overwrite
    FAILED = "failed"  # any other error (denied, API server down); the next cycle re-plans


@dataclass(frozen=True)
class ApplyResult:
    status: ApplyStatus
    cluster: RayClusterView | None = None  # the RayCluster our patch produced, when applied
    error: str | None = None


def apply_reclaim(kube: KubeAdapter, plan: ReclaimPlan) -> ApplyResult:
    """Send ``reclaim_patch(plan)``; errors come back as values, never raised.

    The adapter reports a failed resourceVersion test as ConflictError (also
    when a custom resource answers it with a bare 422): the plan is stale.
    """
    try:
        written = kube.patch_raycluster(plan.namespace, plan.cluster, reclaim_patch(plan))
    except ConflictError as e:
        return ApplyResult(ApplyStatus.CONFLICT, error=str(e))
    except RayGpuError as e:
        return ApplyResult(ApplyStatus.FAILED, error=str(e))
    return ApplyResult(ApplyStatus.APPLIED, cluster=written)


def release_reservation(kube: KubeAdapter, namespace: str, cluster: str, decision: GcDecision) -> tuple[str, bool]:
    """One step of releasing a reservation, never blocking on pods. Idempotent.

    Scales its worker group to zero (KubeRay deletes the pods); once no pod is
    left, removes the group and deletes the state ConfigMap. The backend's gang
    objects (PodGroups) are owned by the ConfigMap, so the Kubernetes garbage
    collector deletes them. Returns (group outcome: ``"removed"``, ``"absent"``
    or ``"draining"``, ConfigMap deleted); while draining, the ConfigMap stays
    so the next cycle's plan releases it again and finishes. Raises RayGpuError
    on failure.
    """
    return finish_release(kube, namespace, cluster, decision.reservation, decision.group, drain_timeout_s=0)


class ReleaseStatus(str, Enum):
    RELEASED = "released"  # this step removed the worker group or deleted the state ConfigMap
    ALREADY_RELEASED = "already-released"  # nothing left to do: an earlier cycle (or the driver) did it
    DRAINING = "draining"  # the group is at zero replicas, its pods still going: a later cycle finishes
    FAILED = "failed"  # the error says why; the next cycle re-plans


@dataclass(frozen=True)
class ReleaseResult:
    decision: GcDecision
    status: ReleaseStatus
    group_removed: bool = False
    configmap_deleted: bool = False
    error: str | None = None


def apply_release(kube: KubeAdapter, namespace: str, cluster: str, decision: GcDecision) -> ReleaseResult:
    """One ``release_reservation`` step for ``decision``; errors come back as values, never raised."""
    try:
        group_state, cm_deleted = release_reservation(kube, namespace, cluster, decision)
    except RayGpuError as e:
        return ReleaseResult(decision, ReleaseStatus.FAILED, error=str(e))
    if group_state == GROUP_DRAINING:
        return ReleaseResult(decision, ReleaseStatus.DRAINING)
    group_removed = group_state == GROUP_REMOVED
    status = ReleaseStatus.RELEASED if group_removed or cm_deleted else ReleaseStatus.ALREADY_RELEASED
    return ReleaseResult(decision, status, group_removed=group_removed, configmap_deleted=cm_deleted)
