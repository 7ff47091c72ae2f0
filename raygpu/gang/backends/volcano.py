"""Backend ``volcano``: a Volcano PodGroup (``scheduling.volcano.sh/v1beta1``).

Volcano's gang plugin binds none of the group's pods until ``minMember`` fit,
and its enqueue action admits the group only when the queue has
``minResources``. Pods join with the annotation ``scheduling.k8s.io/group-name``
and ``schedulerName: volcano``.
"""

from __future__ import annotations

from typing import Any

from raygpu.gang.backends.base import GangBackend, pod_group
from raygpu.model.gang import Backend, GangPlan, GangRequest

GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
API_VERSION = "scheduling.volcano.sh/v1beta1"
SCHEDULER_NAME = "volcano"
DEFAULT_QUEUE = "default"


class VolcanoBackend(GangBackend):
    name = Backend.VOLCANO

    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        template["metadata"]["annotations"][GROUP_NAME_ANNOTATION] = plan.gang_name
        template.setdefault("spec", {})["schedulerName"] = SCHEDULER_NAME

    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        """One PodGroup: minMember = pods, minResources = their summed requests, queue (default "default")."""
        return [pod_group(API_VERSION, plan, request, owner_ref, queue=plan.queue or DEFAULT_QUEUE)]
