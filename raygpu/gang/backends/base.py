"""The gang backend contract: pure builders of the objects that make a reservation all-or-nothing.

A backend turns a :class:`~raygpu.model.gang.GangPlan` into (1) the worker
group spec appended to the RayCluster, a copy of the template group whose pods
carry the backend's gang wiring, and (2) any extra Kubernetes objects
(PodGroups) to create before it. Backends do no I/O; adapters apply what they build.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from raygpu.errors import PermanentError
from raygpu.gang.backends.topology import add_pack_affinity, add_pod_affinity
from raygpu.model.gang import Backend, GangPlan, GangRequest
from raygpu.model.labels import (ANNOTATION_PLAN_REASON, LABEL_CLUSTER, LABEL_OWNER_JOB, LABEL_RESERVATION,
                                 LABEL_SCHEDULING_GROUP, dns_label)
from raygpu.model.raycluster import GroupTemplate

# Gang wiring a copied template may already carry (for another gang); stripped before ours is added.
FOREIGN_GANG_LABELS = ("scheduling.x-k8s.io/pod-group", "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/pod-group-name",
                       "volcano.sh/queue-name", LABEL_SCHEDULING_GROUP)
FOREIGN_GANG_ANNOTATIONS = ("kueue.x-k8s.io/pod-group-total-count", "scheduling.k8s.io/group-name")


def format_quantity(resource: str, amount: float) -> str:
    """A Kubernetes quantity string: integers as-is, fractional CPU in millicores."""
    if float(amount).is_integer():
        return str(int(amount))
    if resource == "cpu":
        return f"{math.ceil(amount * 1000)}m"
    return repr(float(amount))


def min_resources(plan: GangPlan) -> dict[str, str]:
    """What the whole gang requests: one pod's requests times ``plan.pod_count``."""
    return {k: format_quantity(k, v * plan.pod_count) for k, v in sorted(plan.need.k8s_requests.items())}


def gang_object_metadata(plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> dict[str, Any]:
    """Metadata shared by every gang object: name, labels raygpu finds it by, owner for GC."""
    labels = {LABEL_RESERVATION: plan.reservation_group, LABEL_CLUSTER: dns_label(plan.cluster)}
    if request.owner_job:
        labels[LABEL_OWNER_JOB] = dns_label(request.owner_job)
    meta: dict[str, Any] = {"name": plan.gang_name, "namespace": plan.namespace, "labels": labels,
                            "annotations": {ANNOTATION_PLAN_REASON: plan.reason}}
    if owner_ref:
        meta["ownerReferences"] = [dict(owner_ref)]
    return meta


def pod_group(api_version: str, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None,
              **spec: Any) -> dict[str, Any]:
    """A PodGroup (scheduler-plugins or Volcano): ``minMember`` = pods, ``minResources`` = their
    summed requests, plus the backend's own ``spec`` fields."""
    return {"apiVersion": api_version, "kind": "PodGroup", "metadata": gang_object_metadata(plan, request, owner_ref),
            "spec": {"minMember": plan.pod_count, "minResources": min_resources(plan), **spec}}


class GangBackend(ABC):
    """Builds the Kubernetes side of one reservation. Pure: same inputs, same dicts; no I/O."""

    name: ClassVar[Backend]

    def worker_group_spec(self, plan: GangPlan, template_group: GroupTemplate, request: GangRequest) -> dict[str, Any]:
        """The worker group to append to ``spec.workerGroupSpecs``.

        A deep copy of ``template_group`` named ``plan.reservation_group`` with
        ``replicas = minReplicas = maxReplicas = plan.pod_count``; Ray nodes get
        the group label ``raygpu.io/reservation`` (KubeRay passes group ``labels``
        to ``ray start --labels``), pods the same pod label, then the backend's
        wiring. Raises PermanentError if the plan is for another backend or template.
        """
        if plan.backend is not self.name:
            raise PermanentError(f"plan {plan.name!r} is for backend {plan.backend.value}, not {self.name.value}")
        if template_group.group_name != plan.need.template_group:
            raise PermanentError(f"plan {plan.name!r} copies group '{plan.need.template_group}', "
                                 f"got '{template_group.group_name}'")
        n = plan.pod_count
        template = copy.deepcopy(template_group.template)
        meta = template.setdefault("metadata", {})
        labels = meta.setdefault("labels", {})
        annotations = meta.setdefault("annotations", {})
        for key in FOREIGN_GANG_LABELS:
            labels.pop(key, None)
        for key in FOREIGN_GANG_ANNOTATIONS:
            annotations.pop(key, None)
        (template.get("spec") or {}).pop("schedulingGroup", None)  # a Kubernetes PodGroup of someone else
        labels[LABEL_RESERVATION] = plan.reservation_group
        if request.owner_job:
            labels[LABEL_OWNER_JOB] = dns_label(request.owner_job)
        spec: dict[str, Any] = {
            "groupName": plan.reservation_group,
            "replicas": n,
            "minReplicas": n,
            "maxReplicas": n,
            "rayStartParams": dict(template_group.ray_start_params),
            "labels": {**template_group.ray_labels, LABEL_RESERVATION: plan.reservation_group},
            "template": template,
        }
        self.wire_pods(template, plan, request)
        self.wire_topology(template, plan)
        add_pack_affinity(template, plan)
        return spec

    @abstractmethod
    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        """Add this backend's gang wiring to the copied pod ``template`` (mutated in place)."""

    @abstractmethod
    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Extra Kubernetes objects to create before the worker group; ``owner_ref`` (the RayCluster) for GC."""

    def wire_topology(self, template: dict[str, Any], plan: GangPlan) -> None:
        """Write ``plan.topology`` on the copied pod ``template``; by default the pod-affinity fallback
        (gang/backends/topology.py). Backends with a native constraint override it."""
        add_pod_affinity(template, plan)

    def check_created(self, sent: dict[str, Any], made: dict[str, Any]) -> None:
        """Raise PermanentError if the server's answer ``made`` to creating ``sent`` lost what the gang needs
        (a field the server dropped). Nothing by default."""

    def requeue_patches(self, plan: GangPlan, now_s: float) -> list[tuple[str, str, str, dict[str, Any]]]:
        """Merge patches (apiVersion, kind, name, body) that make the gang scheduler look at a waiting gang
        again; sent with each heartbeat while the reservation waits. None by default."""
        return []
