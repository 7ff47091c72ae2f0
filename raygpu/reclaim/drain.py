"""Drain before delete: Ray agrees that each worker is idle before the sidecar's patch removes it.

A plan is made from a snapshot; Ray may place a task on an idle worker between
that snapshot and the patch. So, as Ray's autoscaler v2 does before it
terminates an idle instance, the sidecar asks the GCS to drain each worker it
is about to delete (``DrainNode``, reason ``IDLE_TERMINATION``,
``raygpu.adapters.ray_gcs.drain_idle_node``). The raylet accepts only while
the node is idle, and from then on takes no new work; a refused or failed
drain keeps the worker (``DrainRejected``), the rest of the plan goes on.

An accepted drain cannot be undone: the raylet exits, and the pod's container
restarts it as a new Ray node. If the patch after the drain does not land
(conflict, API error), ``DrainMemory`` remembers the pod, and the next plan
deletes it without waiting for the idle timeout again (``Drained``), after a
new drain of whatever Ray node the pod has by then. A pod whose restarted Ray
node took work is forgotten: it is a fresh worker. A sidecar restart forgets
too; the pod then waits the full idle timeout again, which breaks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from raygpu.model.reclaim import ReclaimPlan
from raygpu.model.views import K8sPodView, RayView
from raygpu.plan.reclaim.drain import drain_targets, keep_workers

Drain = Callable[[str, str], "tuple[bool, str]"]  # (Ray node id, message) -> (accepted, why not)


@dataclass(frozen=True)
class DrainResult:
    plan: ReclaimPlan  # the plan without the workers Ray refused to drain
    drained: dict[str, str] = field(default_factory=dict)  # pod -> Ray node id, drains Ray accepted
    rejected: dict[str, str] = field(default_factory=dict)  # pod -> why it stays


def drain_workers(plan: ReclaimPlan, drain: Drain, read_ray: Callable[[], RayView]) -> DrainResult:
    """Drain every worker ``plan`` deletes; the plan without those Ray refused (never raises if ``drain``
    and ``read_ray`` do not). A worker whose pod had no live Ray node at the snapshot (drained earlier)
    gets the Ray node it has now, read again, drained too; one that cannot be read stays."""
    targets = drain_targets(plan)
    fresh: dict[str, str] | None = None
    drained, rejected = {}, {}
    for pod, node_id in sorted(targets.items()):
        if node_id is None:
            if fresh is None:
                view = read_ray()
                fresh = ({n.instance_id: n.node_id for n in view.nodes if n.alive and n.instance_id}
                         if view.reachable else {})
                if not view.reachable:
                    rejected.update({p: f"Ray unreachable before the drain: {view.reason}"
                                     for p, n in targets.items() if n is None})
            if pod in rejected:
                continue
            node_id = fresh.get(pod)
            if node_id is None:
                continue  # no Ray node on this pod: nothing Ray could place there
        accepted, why = drain(node_id, f"raygpu: idle worker {pod} of {plan.namespace}/{plan.cluster} is removed")
        if accepted:
            drained[pod] = node_id
        else:
            rejected[pod] = f"Ray refused the idle drain of node {node_id}: {why}"
    return DrainResult(keep_workers(plan, rejected), drained, rejected)


class DrainMemory:
    """Pods this process drained whose deletion has not been seen to land (see the module docstring)."""

    def __init__(self) -> None:
        self._pods: dict[str, str] = {}  # pod name -> its uid when drained
        self._uids: dict[str, str] = {}  # pod name -> uid, as of the last ``current``

    def remember(self, drained: dict[str, str]) -> None:
        self._pods.update({name: self._uids.get(name, "") for name in drained})

    def current(self, pods: tuple[K8sPodView, ...], ray: RayView) -> frozenset[str]:
        """The remembered pods still to delete by drain: the same pod (name and uid) still exists and is not
        deleting, and its Ray node, if any, has not taken work since (a restarted node that is busy is a
        fresh worker: forgotten)."""
        self._uids = {p.name: p.uid for p in pods if not p.deleting}
        busy = ({n.instance_id for n in ray.nodes if n.alive and not n.draining and n.idle_since_s is None}
                if ray.reachable else set())
        self._pods = {n: u for n, u in self._pods.items() if self._uids.get(n) == u and n not in busy}
        return frozenset(self._pods)
