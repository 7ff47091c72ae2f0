"""Writing a gang's topology constraint (``plan.topology``) where each backend can express it.

| backend | required | preferred |
|---|---|---|
| workload | Workload PodGroupTemplate and PodGroup ``spec.schedulingConstraints.topology: [{key}]`` | pod affinity (preferred) |
| kueue | pod annotation ``kueue.x-k8s.io/podset-required-topology: <key>`` | ``kueue.x-k8s.io/podset-preferred-topology`` |
| coscheduling, volcano, none | pod affinity (required) to the reservation's own pods | pod affinity (preferred) |

Pod affinity is the fallback every backend can do: each pod requires (or prefers) a node whose ``key``
value is that of the nodes running the reservation's other pods (``raygpu.io/reservation=<group>``).
kube-scheduler lets the first pod of such a group go anywhere (a pod that matches its own affinity
term, with no matching pod yet, passes), and every later pod follows it. A required constraint is so
never broken; what it cannot do is choose the domain for the whole gang at once: when the first pod's
domain lacks room for the rest, the gang waits and is rolled back at its timeout (docs/decisions.md).
``PACK`` over several pods (``add_pack_affinity``): each pod *prefers* a node that already runs one of the
reservation's pods (``topologyKey: kubernetes.io/hostname``), so the pods of a split gang land together
where there is room, as Ray's PACK packs bundles onto as few nodes as it can, and still bind to separate
fragments where there is not (issue 11 item 1, docs/gang.md "Pod shapes").
Pure dict building: no I/O.
"""

from __future__ import annotations

from typing import Any

from raygpu.model.gang import GangPlan, Strategy
from raygpu.model.labels import LABEL_RESERVATION

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
KUEUE_TOPOLOGY_ANNOTATIONS = (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED)
PREFERRED_WEIGHT = 100  # the most a preferred affinity term weighs
HOSTNAME = "kubernetes.io/hostname"


def affinity_term(plan: GangPlan, key: str | None = None) -> dict[str, Any]:
    """The pod affinity term: pods of this reservation, one domain of ``key`` (default ``plan.topology.key``)."""
    if key is None:
        assert plan.topology is not None
        key = plan.topology.key
    return {"labelSelector": {"matchLabels": {LABEL_RESERVATION: plan.reservation_group}}, "topologyKey": key}


def _pod_affinity(template: dict[str, Any]) -> dict[str, Any]:
    """The pod ``template``'s podAffinity, made where missing (its own terms kept)."""
    return template.setdefault("spec", {}).setdefault("affinity", {}).setdefault("podAffinity", {})


def _prefer(template: dict[str, Any], term: dict[str, Any]) -> None:
    _pod_affinity(template).setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
        {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term})


def add_pod_affinity(template: dict[str, Any], plan: GangPlan) -> None:
    """Append the reservation's pod affinity (required or preferred) to the pod ``template``, keeping the
    template's own affinity terms (mutated in place). Does nothing without ``plan.topology``."""
    if plan.topology is None:
        return
    if plan.topology.required:
        _pod_affinity(template).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            affinity_term(plan))
    else:
        _prefer(template, affinity_term(plan))


def add_pack_affinity(template: dict[str, Any], plan: GangPlan) -> None:
    """PACK on more than one pod: a preferred pod affinity (weight 100, one Kubernetes node) to the
    reservation's own pods, appended to the template's own terms (mutated in place). Nothing for one pod,
    for SPREAD/STRICT_SPREAD (they spread on purpose) and STRICT_PACK (always one pod)."""
    if plan.strategy is not Strategy.PACK or plan.pod_count < 2:
        return
    _prefer(template, affinity_term(plan, HOSTNAME))


def kueue_annotations(template: dict[str, Any], plan: GangPlan) -> None:
    """Kueue's Topology Aware Scheduling annotation for ``plan.topology`` on the pod ``template``; a TAS
    annotation the copied template carried is replaced (Kueue refuses a pod with two). Kueue admits the
    group only into a ResourceFlavor with a Topology whose levels include the key: elsewhere the gang
    stays unadmitted (never placed without the constraint) and is rolled back at its timeout."""
    if plan.topology is None:
        return
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    for key in KUEUE_TOPOLOGY_ANNOTATIONS:
        annotations.pop(key, None)
    annotations[KUEUE_REQUIRED if plan.topology.required else KUEUE_PREFERRED] = plan.topology.key


def scheduling_constraints(plan: GangPlan) -> dict[str, Any]:
    """The Workload API's ``schedulingConstraints`` for a required ``plan.topology`` (``{}`` otherwise):
    ``{"topology": [{"key": <node label>}]}``, as scheduling.k8s.io v1alpha2, v1alpha3 and v1beta1 define
    ``PodGroupSchedulingConstraints`` (one constraint at most; feature gate TopologyAwareWorkloadScheduling)."""
    if plan.topology is None or not plan.topology.required:
        return {}
    return {"schedulingConstraints": {"topology": [{"key": plan.topology.key}]}}
