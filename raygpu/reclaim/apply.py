"""Applying the sidecar's plans: one tested JSON patch per RayCluster, and reservation releases.

``reclaim_patch`` is pure (plan in, RFC 6902 ops out); ``apply_reclaim`` and
``release_reservation`` do the writes through ``KubeAdapter`` and reuse the gang
module's release code; ``apply_release`` is the garbage collector's step for
one reservation, its outcome a value (``ReleaseResult``), never an exception.
The collector writes only what its plan proved raygpu created (``GcDecision``'s
``group_owned`` and ``state_uid``), and re-checks the group's proof on the
RayCluster each patch is tested against.

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
from raygpu.errors import ConflictError, PermanentError, RayGpuError
from raygpu.gang.reservation import GroupOutcome, remove_reservation_group
from raygpu.model.gc import GcAction, GcDecision, is_reservation_group
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPlan
from raygpu.plan.common.patch import guard_group_name, raycluster_patch, set_replicas, set_workers_to_delete


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


class ReleaseStatus(str, Enum):
    RELEASED = "released"  # this step removed the worker group or deleted the state ConfigMap
    SCALED_TO_ZERO = "scaled-to-zero"  # StateLost: this step scaled the (proven) group to zero; it stays
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


def release_reservation(kube: KubeAdapter, namespace: str, cluster: str,
                        decision: GcDecision) -> tuple[GroupOutcome, bool]:
    """One step of releasing a reservation (action ``release``), never blocking on pods. Idempotent.

    Writes only what ``decision`` proved raygpu's. The group (``group_owned``):
    the gang module's ``remove_reservation_group`` scales it to zero (KubeRay
    deletes the pods) and, once no pod is left, removes it, re-checking its
    label on the RayCluster each patch is tested against. The state ConfigMap
    (``state_uid``) is then deleted by name with a uid precondition, so a
    same-named object made since is never deleted; its backend objects
    (PodGroups) are owned by it and go with it. Returns (the group's
    ``GroupOutcome``, ConfigMap deleted); while
    draining the ConfigMap stays so the next cycle finishes. Raises
    PermanentError for a decision without a proven ConfigMap, RayGpuError on failure.
    """
    if decision.action is not GcAction.RELEASE or not decision.state_uid:
        raise PermanentError(f"refusing to release {decision.reservation}: no proven state ConfigMap "
                             f"(action {decision.action.value})")
    group_state = GroupOutcome.ABSENT
    if decision.group_owned:
        group_state = remove_reservation_group(kube, namespace, cluster, decision.group, drain_timeout_s=0)
        if group_state is GroupOutcome.DRAINING:
            return group_state, False
    try:
        return group_state, kube.delete("v1", "ConfigMap", decision.reservation, namespace, uid=decision.state_uid)
    except ConflictError:
        return group_state, False  # another object has that name now: ours is gone, the other is not ours


def scale_group_to_zero(kube: KubeAdapter, namespace: str, cluster: str, group: str) -> bool:
    """Scale reservation group ``group`` to zero replicas (its pods in ``workersToDelete``); never removes it.

    Only when the RayCluster read here shows the group provably raygpu's
    (``is_reservation_group``); the patch tests that read's resourceVersion,
    so the proof holds for what it writes. True when it wrote; False when there
    was nothing to write (group absent, not raygpu's, already at zero with every
    pod listed). Raises RayGpuError (ConflictError: the cluster changed, the next
    cycle re-plans).
    """
    view = kube.get_raycluster(namespace, cluster)
    try:
        idx = view.group_index(group)
    except KeyError:
        return False
    g = view.worker_groups[idx]
    if not is_reservation_group(g):
        return False
    pods = sorted(p.name for p in kube.ray_pods(namespace, cluster) if p.ray_group == group and not p.deleting)
    if g.replicas == 0 and g.min_replicas == 0 and set(pods) <= set(g.workers_to_delete):
        return False
    ops = [*set_replicas(idx, 0, group), {"op": "add", "path": f"/spec/workerGroupSpecs/{idx}/minReplicas", "value": 0},
           *set_workers_to_delete(idx, pods)]
    kube.patch_raycluster(namespace, cluster, raycluster_patch(view.resource_version, ops))
    return True


def apply_release(kube: KubeAdapter, namespace: str, cluster: str, decision: GcDecision) -> ReleaseResult:
    """One garbage-collection step for ``decision`` (``release_reservation``, or ``scale_group_to_zero`` for
    action ``scale-to-zero``); errors come back as values, never raised."""
    try:
        if decision.action is GcAction.SCALE_TO_ZERO:
            if not decision.group_owned:
                raise PermanentError(f"refusing to scale {decision.group}: not provably raygpu's")
            wrote = scale_group_to_zero(kube, namespace, cluster, decision.group)
            return ReleaseResult(decision, ReleaseStatus.SCALED_TO_ZERO if wrote else ReleaseStatus.ALREADY_RELEASED)
        group_state, cm_deleted = release_reservation(kube, namespace, cluster, decision)
    except RayGpuError as e:
        return ReleaseResult(decision, ReleaseStatus.FAILED, error=str(e))
    if group_state is GroupOutcome.DRAINING:
        return ReleaseResult(decision, ReleaseStatus.DRAINING)
    group_removed = group_state is GroupOutcome.REMOVED
    status = ReleaseStatus.RELEASED if group_removed or cm_deleted else ReleaseStatus.ALREADY_RELEASED
    return ReleaseResult(decision, status, group_removed=group_removed, configmap_deleted=cm_deleted)
