"""One sidecar cycle as data: the state it observed, and the plan it made.

``raygpu.plan.reclaim.cycle.plan_cycle(state) -> CyclePlan`` is the sidecar's one
decision, like Ray autoscaler v2's ``schedule(SchedulingRequest) ->
SchedulingReply``: everything the cycle saw goes in (the RayCluster, its pods
and reservation ConfigMaps from the watch cache, Ray's view and job table, the
policy, the clock), the garbage collector's and the reclaimer's plans come out.
Pure data: no I/O.
"""

from __future__ import annotations

from pydantic import Field

from raygpu.model.base import Frozen
from raygpu.model.gc import DEFAULT_HEARTBEAT_TIMEOUT_S, GcPlan, OrphanGroup, ReservationRecord, SeenAt
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPlan, ReclaimPolicy
from raygpu.model.views import K8sPodView, RayView


class CycleState(Frozen):
    """What one cycle observed of one RayCluster at ``now_s``.

    ``jobs`` maps Ray job id (hex) -> alive, None when the job table could not be
    read. ``seen`` maps a state ConfigMap's name -> when the sidecar saw it and
    its heartbeat change; ``orphan_groups`` maps a worker group without a proven
    state ConfigMap -> when the sidecar first saw it so and whether it saw its
    state before. Both are measured on the sidecar's clock, like ``now_s``.
    """

    now_s: float
    cluster: RayClusterView
    pods: tuple[K8sPodView, ...] = ()
    reservations: tuple[ReservationRecord, ...] = ()
    ray: RayView
    jobs: dict[str, bool] | None = None
    policy: ReclaimPolicy
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    seen: dict[str, SeenAt] = Field(default_factory=dict)
    orphan_groups: dict[str, OrphanGroup] = Field(default_factory=dict)


class CyclePlan(Frozen):
    """The cycle's decisions: reservations to release (``gc``), then workers to remove (``reclaim``)."""

    gc: GcPlan
    reclaim: ReclaimPlan
