"""Backend ``kueue``: Kueue's plain-pod groups.

Kueue's pod webhook gates every pod carrying ``kueue.x-k8s.io/queue-name``;
pods that also share ``kueue.x-k8s.io/pod-group-name`` and the annotation
``kueue.x-k8s.io/pod-group-total-count`` become one Workload, admitted whole
once the LocalQueue has quota for all of them. No extra objects: Kueue makes
the Workload itself. Needs the ``pod`` integration enabled in Kueue's config.
"""

from __future__ import annotations

from typing import Any

from raygpu.errors import PermanentError
from raygpu.gang.backends.base import GangBackend
from raygpu.gang.backends.topology import kueue_annotations
from raygpu.model.gang import Backend, GangPlan, GangRequest

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# A gang is not retried pod by pod: when its pods go (release or failure) the
# Workload finishes and its quota is freed at once (Kueue's isUnretriableGroup).
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"


class KueueBackend(GangBackend):
    name = Backend.KUEUE

    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        """Raises PermanentError without a queue: Kueue would leave the pods unmanaged, not gang them."""
        queue = plan.queue or request.queue
        if not queue:
            raise PermanentError("backend kueue needs a LocalQueue: set raygpu.io/queue or pass queue=")
        template["metadata"]["labels"][QUEUE_NAME_LABEL] = queue
        template["metadata"]["labels"][POD_GROUP_NAME_LABEL] = plan.gang_name
        template["metadata"]["annotations"][POD_GROUP_TOTAL_COUNT_ANNOTATION] = str(plan.pod_count)
        template["metadata"]["annotations"][RETRIABLE_IN_GROUP_ANNOTATION] = "false"

    def wire_topology(self, template: dict[str, Any], plan: GangPlan) -> None:
        """Kueue's TAS annotation (required or preferred), not pod affinity: Kueue picks the domain for the
        whole group at admission and its scheduling gate then pins each pod there."""
        kueue_annotations(template, plan)

    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        return []
