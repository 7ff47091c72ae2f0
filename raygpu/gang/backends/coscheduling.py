"""Backend ``coscheduling``: a scheduler-plugins PodGroup (``scheduling.x-k8s.io/v1alpha1``).

The coscheduling plugin holds the group's pods at Permit until ``minMember``
of them can be placed, and rejects the whole group after
``scheduleTimeoutSeconds``. Pods join with the label
``scheduling.x-k8s.io/pod-group: <PodGroup name>`` and must be scheduled by the
scheduler running the plugin: ``plan.scheduler_name`` (the request's ``scheduler_name``, else the
RayCluster's ``raygpu.io/gang-scheduler-name``, else ``scheduler-plugins-scheduler`` as in the upstream
chart).

The plugin requeues the pods it rejected only on a Pod add or a PodGroup
add/update, not when a node is added or another gang's pods leave: without
help they wait for the scheduler's unschedulable-queue flush (5 min by
default). While the gang waits, each heartbeat therefore touches the PodGroup
(annotation ``raygpu.io/requeue-at``), so freed room is tried within seconds.
"""

from __future__ import annotations

import math
from typing import Any

from raygpu.gang.backends.base import GangBackend, pod_group
from raygpu.model.gang import DEFAULT_GANG_SCHEDULER_NAME, Backend, GangPlan, GangRequest
from raygpu.model.labels import ANNOTATION_REQUEUE

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
API_VERSION = "scheduling.x-k8s.io/v1alpha1"
DEFAULT_SCHEDULER_NAME = DEFAULT_GANG_SCHEDULER_NAME


class CoschedulingBackend(GangBackend):
    name = Backend.COSCHEDULING

    def __init__(self, scheduler_name: str = DEFAULT_SCHEDULER_NAME) -> None:
        self.scheduler_name = scheduler_name  # used for a plan that names none (one made before plans carried it)

    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        template["metadata"]["labels"][POD_GROUP_LABEL] = plan.gang_name
        template.setdefault("spec", {})["schedulerName"] = plan.scheduler_name or self.scheduler_name

    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        """One PodGroup: minMember = pods, minResources = their summed requests, timeout from the request."""
        return [pod_group(API_VERSION, plan, request, owner_ref,
                          scheduleTimeoutSeconds=max(1, math.ceil(plan.timeout_s)))]

    def requeue_patches(self, plan: GangPlan, now_s: float) -> list[tuple[str, str, str, dict[str, Any]]]:
        """Touch the PodGroup: a PodGroup update is an event the Coscheduling plugin requeues its pods on."""
        return [(API_VERSION, "PodGroup", plan.gang_name,
                 {"metadata": {"annotations": {ANNOTATION_REQUEUE: f"{now_s:.0f}"}}})]
