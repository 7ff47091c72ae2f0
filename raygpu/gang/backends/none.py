"""Backend ``none``: the worker group alone.

The scale-up is atomic at the RayCluster (one patch adds all ``n`` replicas),
but kube-scheduler still binds the pods one by one: no Kubernetes-level gang.
"""

from __future__ import annotations

from typing import Any

from raygpu.gang.backends.base import GangBackend
from raygpu.model.gang import Backend, GangPlan, GangRequest


class NoneBackend(GangBackend):
    name = Backend.NONE

    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        return None  # nothing beyond the reservation label the base adds

    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        return []
