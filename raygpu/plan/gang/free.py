"""What each worker-group template's pods could bind now: the free capacity ``plan_gang`` weighs per template.

A template's pods may use only the nodes its pod spec allows, so the free
capacity is per template (issue 11 item 1): the nodes whose labels match the
template's ``nodeSelector`` and whose NoSchedule/NoExecute taints its
``tolerations`` tolerate, minus what the pods bound there request
(``gang_shapes.free_nodes``: ready, uncordoned nodes only). Node affinity is
not read, so a template with a required node affinity may be credited nodes it
cannot use: the result ranks pod shapes (prefer one that binds now), it never
admits or refuses anything. A node a GPU health agent marked unhealthy
(``plan.common.health.node_health_signals``) is credited nothing: no reservation is
planned onto it (``unhealthy_node_names``; the reservation's pods also carry a
required node affinity that keeps them off it, ``plan.gang.reserve``). Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from raygpu.model.gang import NodeFree
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sNodeView, K8sPodView, Toleration
from raygpu.plan.common.health import node_health_signals
from raygpu.plan.gang.shapes import free_nodes

_BLOCKING = ("NoSchedule", "NoExecute")


def template_tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """The tolerations of a pod spec; an entry that does not parse is left out (it tolerates nothing)."""
    out = []
    for t in spec.get("tolerations") or []:
        if not isinstance(t, dict):
            continue
        try:
            out.append(Toleration(**{k: t[k] for k in ("key", "value", "effect") if t.get(k) is not None},
                                  operator=t.get("operator") or "Equal"))
        except (TypeError, ValueError):
            continue
    return tuple(out)


def may_use(node: K8sNodeView, spec: Mapping[str, Any]) -> bool:
    """Whether a pod of ``spec`` may be placed on ``node``: its nodeSelector matches the node's labels and its
    tolerations cover the node's NoSchedule/NoExecute taints."""
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, dict) or any(node.labels.get(k) != v for k, v in selector.items()):
        return False
    tols = template_tolerations(spec)
    return all(any(t.tolerates(x) for t in tols) for x in node.taints if x.effect in _BLOCKING)


def free_by_template(cluster: RayClusterView, nodes: Sequence[K8sNodeView],
                     pods: Sequence[K8sPodView]) -> dict[str, tuple[NodeFree, ...]]:
    """Worker group name -> the free capacity of the nodes its pods may use (``plan_gang(free=...)``)."""
    sick = set(unhealthy_node_names(nodes))
    everywhere = [f for f in free_nodes(nodes, pods) if f.name not in sick]
    by_name = {n.name: n for n in nodes}
    out = {}
    for g in cluster.worker_groups:
        spec = (g.template or {}).get("spec") or {}
        out[g.group_name] = tuple(f for f in everywhere if may_use(by_name[f.name], spec))
    return out


def unhealthy_node_names(nodes: Sequence[K8sNodeView], cluster: RayClusterView | None = None) -> tuple[str, ...]:
    """The names of the nodes a GPU health agent marked unhealthy (a condition, taint or label), sorted; with
    ``cluster``, only those a pod of one of its worker groups may use (the others need no keeping off)."""
    sick = [n for n in nodes if node_health_signals(n)]
    if cluster is not None:
        specs = [(g.template or {}).get("spec") or {} for g in cluster.worker_groups]
        sick = [n for n in sick if any(may_use(n, spec) for spec in specs)]
    return tuple(sorted(n.name for n in sick))
