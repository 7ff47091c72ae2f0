"""Read what each worker-group template could bind now, for ``plan_gang(free=...)`` (docs/gang.md, pod shapes).

Optional by design: the driver's base Role (deploy/driver) cannot list Nodes,
so ``free_now`` first asks the API server whether it may (a
SelfSubjectAccessReview, which every authenticated identity may create: no
refused request) and reads nothing when it may not. Any failure of the reads
means "not known" (``None``): the planner then ranks shapes by waste and the
smallest pods, exactly as without this. One list of Nodes and one of the pods
bound to a node and not ended (field selectors), per reservation.
"""

from __future__ import annotations

from typing import Callable

from raygpu.adapters.kube import KubeAdapter, node_view, parse_each, pod_view
from raygpu.errors import RayGpuError
from raygpu.model.gang import NodeFree
from raygpu.model.raycluster import RayClusterView
from raygpu.plan.gang.free import free_by_template, unhealthy_node_names

BOUND_AND_RUNNING = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def can_i(kube: KubeAdapter, verb: str, resource: str, group: str = "", namespace: str | None = None) -> bool:
    """Whether this identity may ``verb`` ``resource`` cluster-wide, or in ``namespace`` (False when the review
    itself fails)."""
    attrs = {"verb": verb, "resource": resource, "group": group, **({"namespace": namespace} if namespace else {})}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {},
              "spec": {"resourceAttributes": attrs}}
    try:
        return bool((kube.create(review).get("status") or {}).get("allowed"))
    except RayGpuError:
        return False


def free_now(kube: KubeAdapter, view: RayClusterView, progress: Callable[[str], None]
             ) -> tuple[dict[str, tuple[NodeFree, ...]] | None, tuple[str, ...]]:
    """Worker group name -> free capacity of the nodes its pods may use, and the nodes a GPU health agent marked
    unhealthy (none of their capacity is credited; the reservation keeps its pods off them). ``(None, ())``
    when not known (no permission to list Nodes and Pods cluster-wide, or a read failed), said once through
    ``progress``."""
    if not (can_i(kube, "list", "nodes") and can_i(kube, "list", "pods")):
        progress("free capacity not read (this identity may not list nodes and pods cluster-wide): "
                 "pod shapes by waste, then the smallest pods")
        return None, ()
    try:
        nodes = parse_each(kube.list("v1", "Node"), node_view, "Node")
        pods = parse_each(kube.list("v1", "Pod", field_selector=BOUND_AND_RUNNING), pod_view, "Pod")
    except RayGpuError as e:
        progress(f"free capacity not read ({e}): pod shapes by waste, then the smallest pods")
        return None, ()
    sick = unhealthy_node_names(nodes, view)
    if sick:
        progress(f"nodes marked unhealthy, kept out of the reservation: {', '.join(sick)}")
    return free_by_template(view, nodes, pods), sick
