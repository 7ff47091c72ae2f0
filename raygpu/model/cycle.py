"""One sidecar cycle as data: the state it observed, and the plan it made.

``raygpu.plan.cycle.plan_cycle(state) -> CyclePlan`` is the sidecar's one
decision, like Ray autoscaler v2's ``schedule(SchedulingRequest) ->
SchedulingReply``: everything the cycle saw goes in (the RayCluster, its pods
and reservation ConfigMaps from the watch cache, Ray's view and job table, the
policy, the clock), the garbage collector's and the reclaimer's plans come out.
Pure data: no I/O.
"""

from __future__ import annotations

from pydantic import Field

from raygpu.model.base import Frozen
from raygpu.model.gc import DEFAULT_HEARTBEAT_TIMEOUT_S, GcPlan, ReservationRecord
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPlan, ReclaimPolicy
from raygpu.model.views import K8sPodView, RayView


class CycleState(Frozen):
    """What one cycle observed of one RayCluster at ``now_s``.

    ``jobs`` maps Ray job id (hex) -> alive, None when the job table could not be
    read. ``orphan_groups`` maps a reservation group (``rg-*``) that has no state
    ConfigMap -> (the ConfigMap's expected name, when the sidecar first saw it so).
    """

    now_s: float
    cluster: RayClusterView
    pods: tuple[K8sPodView, ...] = ()
    reservations: tuple[ReservationRecord, ...] = ()
    ray: RayView
    jobs: dict[str, bool] | None = None
    policy: ReclaimPolicy
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    orphan_groups: dict[str, tuple[str, float]] = Field(default_factory=dict)


class CyclePlan(Frozen):
    """The cycle's decisions: reservations to release (``gc``), then workers to remove (``reclaim``)."""

    gc: GcPlan
    reclaim: ReclaimPlan
