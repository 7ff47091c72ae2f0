"""A reclaim plan narrowed to the workers Ray agreed to drain.

Between the plan and its patch the sidecar asks Ray to drain each worker it
deletes (``raygpu.reclaim.drain``); Ray refuses a node that is no longer idle,
e.g. a task placed on it after the snapshot. ``keep_workers`` is the plan
without those workers: each kept with its reason, its group's ``replicas``,
``workersToDelete`` and the plan's totals recomputed. Pure.
"""

from __future__ import annotations

from raygpu.model.reclaim import Decision, DecisionAction, ReclaimPlan, ReclaimReason


def drain_targets(plan: ReclaimPlan) -> dict[str, str | None]:
    """Pod name -> the Ray node id to drain before the patch, for every worker ``plan`` deletes (None: its
    pod has no live Ray node, nothing to drain)."""
    deleted = set(plan.deleted_pods)
    return {d.pod_name: d.ray_node_id for d in plan.decisions if d.pod_name in deleted}


def keep_workers(plan: ReclaimPlan, kept: dict[str, str]) -> ReclaimPlan:
    """``plan`` without deleting the pods in ``kept`` (pod name -> why), each now a KEEP decision with reason
    ``DrainRejected``. Groups left with nothing to add drop out of ``to_delete``; a Kubernetes node a kept
    pod sits on is no longer freed."""
    kept = {n: why for n, why in kept.items() if n in set(plan.deleted_pods)}
    if not kept:
        return plan
    scale_downs = []
    for g in plan.to_delete:
        added = tuple(n for n in g.added if n not in kept)
        if added:
            scale_downs.append(g.model_copy(update={
                "added": added, "replicas": max(0, g.old_replicas - len(added)),
                "workers_to_delete": tuple(n for n in g.workers_to_delete if n not in kept)}))
    decisions = tuple(_kept(d, kept[d.pod_name]) if d.pod_name in kept else d for d in plan.decisions)
    gone = [d for d in plan.decisions if d.pod_name in kept]
    busy_nodes = {d.k8s_node_name for d in gone}
    return plan.model_copy(update={
        "to_delete": tuple(scale_downs), "decisions": decisions,
        "freed_k8s_nodes": tuple(n for n in plan.freed_k8s_nodes if n not in busy_nodes),
        "reclaimed_gpus": plan.reclaimed_gpus - sum(d.gpus for d in gone),
        "idle_gpu_s": plan.idle_gpu_s - sum(d.gpus * (d.idle_for_s or 0.0) for d in gone)})


def _kept(d: Decision, why: str) -> Decision:
    return d.model_copy(update={"action": DecisionAction.KEEP, "reason": ReclaimReason.DRAIN_REJECTED,
                                "detail": why})
