"""The doctor's repair decisions: which findings may be fixed without a human, and how.

Only one finding kind is repaired, and only one way: an **orphan pod** (a
Running Ray worker pod with no live Ray node, past the orphan grace) goes into
its group's ``scaleStrategy.workersToDelete`` and the group's ``replicas`` is
lowered by the number of such pods (never below ``minReplicas``: at the
minimum KubeRay deletes the pod and starts a fresh one in its place). The
whole plan is ONE JSON patch whose first op tests the RayCluster's
``resourceVersion`` (``raygpu.plan.common.patch``), so a concurrent writer (the Ray
autoscaler, another raygpu) makes it fail instead of being overwritten.

Everything else the doctor finds (phantom / stranded GPUs, taints, a broken
device plugin, ghost Ray nodes) needs a human or another owner, and is left
alone. Safety rules, each a ``RepairSkip`` with its reason when it bites:

* the head pod is never touched (deleting it takes the whole cluster down);
* a pod of another RayCluster, of a group the RayCluster no longer has, one
  being deleted, or one already in ``workersToDelete`` is skipped;
* a suspended group is skipped (KubeRay does not reconcile it);
* when no Running pod of the RayCluster (its head included) has a live Ray
  node in the snapshot, the Ray view is not this cluster's (the Ray address
  belongs to another cluster, or the head's GCS lost every node): every pod
  looks orphaned, however few, and nothing is repaired;
* when more than half of a cluster's Running worker pods look orphaned (and
  more than one), the GCS is the likelier culprit (restarted head, network
  split): nothing is repaired.

Pure: no I/O, no clock; the adapter code lives in ``raygpu.doctor.repair``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from raygpu.model.base import Frozen
from raygpu.model.findings import DoctorReport, FindingKind
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sPodView, Snapshot
from raygpu.plan.common.patch import raycluster_patch, set_replicas, set_workers_to_delete

EVENT_REASON = "RepairedOrphanPod"
MAX_ORPHAN_FRACTION = 0.5



class RepairAction(Frozen):
    """Delete one orphan pod through its worker group (KubeRay deletes it)."""

    kind: str = "delete-orphan-pod"
    pod: str
    group: str
    group_index: int
    replicas_before: int
    replicas_after: int
    reason: str

    @property
    def event_message(self) -> str:
        return (f"raygpu doctor: pod {self.pod} of group {self.group} is Running with no live Ray node; "
                f"added to workersToDelete, replicas {self.replicas_before} -> {self.replicas_after}. {self.reason}")


class RepairSkip(Frozen):
    """A finding the repair looked at and left alone, and why."""

    subject: str
    reason: str


class RepairPlan(Frozen):
    """What one repair cycle will write: ``patch`` is None when there is nothing to do."""

    cluster: str
    namespace: str
    resource_version: str
    actions: tuple[RepairAction, ...] = ()
    skipped: tuple[RepairSkip, ...] = ()
    patch: tuple[dict[str, Any], ...] | None = None

    @property
    def empty(self) -> bool:
        return not self.actions


def plan_repair(report: DoctorReport, cluster: RayClusterView, snapshot: Snapshot,
                max_orphan_fraction: float = MAX_ORPHAN_FRACTION) -> RepairPlan:
    """The safe repairs for ``report`` on ``cluster`` (read at ``cluster.resource_version``).

    ``snapshot``: the snapshot the report came from: its pods give each
    orphan's group and role, its live Ray nodes prove the Ray view is this
    cluster's. Deterministic: groups and pods in name order. Never raises on
    well-typed input.
    """
    base = dict(cluster=cluster.name, namespace=cluster.namespace, resource_version=cluster.resource_version)
    mine = {p.name: p for p in snapshot.k8s.pods
            if p.namespace == cluster.namespace and p.ray_cluster == cluster.name}
    skipped: list[RepairSkip] = []
    by_group: dict[str, list[str]] = defaultdict(list)
    already = {p for g in cluster.worker_groups for p in g.workers_to_delete}
    prefix = f"pod/{cluster.namespace}/"
    for f in report.findings:
        if f.kind is not FindingKind.ORPHAN_POD:
            continue
        pod = mine.get(f.subject[len(prefix):]) if f.subject.startswith(prefix) else None
        why = _leave_alone(pod, cluster, already)
        if why is not None:
            skipped.append(RepairSkip(subject=f.subject, reason=why))
        else:
            by_group[pod.ray_group].append(pod.name)  # type: ignore[union-attr,index]

    n = sum(len(v) for v in by_group.values())
    running = sum(1 for p in mine.values() if not p.is_head and p.phase == "Running" and not p.deleting)
    why = _not_this_gcs(snapshot, mine.values(), cluster) if n else None
    if why is None and n > 1 and n > max_orphan_fraction * running:
        why = (f"{n} of {running} Running worker pods look orphaned: more likely the Ray head / GCS than the "
               "pods; not repairing (fix the head, then rerun)")
    if why is not None:
        skipped += [RepairSkip(subject=f"{prefix}{p}", reason=why)
                    for g in sorted(by_group) for p in sorted(by_group[g])]
        return RepairPlan(**base, skipped=tuple(skipped))

    actions: list[RepairAction] = []
    ops: list[dict[str, Any]] = []
    for name in sorted(by_group):
        idx = cluster.group_index(name)
        g = cluster.worker_groups[idx]
        doomed = sorted(by_group[name])
        after = max(g.min_replicas, g.replicas - len(doomed))
        at_min = after > g.replicas - len(doomed)
        note = ("Replicas is at minReplicas: KubeRay starts a fresh pod in its place." if at_min
                else "The group shrinks by the pods that held GPUs for nothing.")
        actions += [RepairAction(pod=p, group=name, group_index=idx, replicas_before=g.replicas,
                                 replicas_after=after, reason=note) for p in doomed]
        # workersToDelete keeps what is already there; set_workers_to_delete writes the whole scaleStrategy
        ops += set_workers_to_delete(idx, [*g.workers_to_delete, *doomed], group_name=name)
        if after != g.replicas:
            ops += set_replicas(idx, after)
    patch = tuple(raycluster_patch(cluster.resource_version, ops)) if ops else None
    return RepairPlan(**base, actions=tuple(actions), skipped=tuple(skipped), patch=patch)


def _not_this_gcs(snapshot: Snapshot, pods: Iterable[K8sPodView], cluster: RayClusterView) -> str | None:
    """Why the Ray view cannot be ``cluster``'s, or None when one of its Running pods has a live Ray node.

    A pod and a Ray node pair by ``instance_id == pod name`` (KubeRay's
    RAY_CLOUD_INSTANCE_ID). A Ray address that answers for another cluster
    pairs with none of this cluster's pods, the head's included, so every pod
    looks orphaned: with one worker that is one orphan, which the fraction rule
    cannot tell from a real one.
    """
    live = {rn.instance_id for rn in snapshot.ray.nodes if rn.alive and rn.instance_id}
    running = [p for p in pods if p.phase == "Running" and not p.deleting]
    if any(p.name in live for p in running):
        return None
    return (f"no pod of RayCluster {cluster.namespace}/{cluster.name} (head included) has a live Ray node in the "
            f"Ray view ({len(live)} live node(s) of other pods): the Ray address belongs to another cluster or the "
            "head's GCS lost its nodes; not repairing (check --ray-address, then rerun)")


def _leave_alone(pod: K8sPodView | None, cluster: RayClusterView, already: set[str]) -> str | None:
    """Why an orphan pod must not be repaired, or None when it may."""
    if pod is None:
        return f"not a pod of RayCluster {cluster.namespace}/{cluster.name}"
    if pod.is_head:
        return "the head pod is never deleted by a repair"
    group = cluster.group(pod.ray_group or "")
    if group is None:
        return f"RayCluster {cluster.name} has no worker group {pod.ray_group}"
    if pod.deleting or pod.phase != "Running":
        return f"pod is {'being deleted' if pod.deleting else pod.phase}"
    if pod.name in already:
        return "already in workersToDelete"
    if group.suspended:
        return f"group {group.group_name} is suspended"
    return None
