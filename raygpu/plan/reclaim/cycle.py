"""The sidecar's one decision per cycle: ``plan_cycle(CycleState) -> CyclePlan``.

Pure: no I/O, no clock (``state.now_s``). The garbage collector plans first;
the reclaimer then treats every group the collector judged as live
(``ReclaimPolicy.live_reservations``), so reservations are released by the
collector and never scaled down from under it.
"""

from __future__ import annotations

from raygpu.model.cycle import CyclePlan, CycleState
from raygpu.model.views import K8sView, Snapshot
from raygpu.plan.reclaim.gc import plan_gc
from raygpu.plan.reclaim.scale_down import plan_reclaim


def plan_cycle(state: CycleState) -> CyclePlan:
    """Plan garbage collection (``plan_gc``), then the scale-down (``plan_reclaim``), from one state."""
    gc = plan_gc(state.reservations, state.ray, state.now_s, cluster=state.cluster, jobs=state.jobs,
                 heartbeat_timeout_s=state.heartbeat_timeout_s, seen=state.seen, orphan_groups=state.orphan_groups)
    policy = state.policy.model_copy(update={"live_reservations": gc.reservation_groups})
    cluster = state.cluster
    snapshot = Snapshot(taken_at_s=state.now_s, cluster=cluster.name, namespace=cluster.namespace, ray=state.ray,
                        k8s=K8sView(pods=state.pods))
    return CyclePlan(gc=gc, reclaim=plan_reclaim(snapshot, cluster, policy, state.now_s))
