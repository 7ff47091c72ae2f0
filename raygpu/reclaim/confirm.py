"""Confirming a garbage-collection release the watch cache suggested, with one live read, before writing it.

The heartbeat and deadline rules of ``plan_gc`` (``NEEDS_LIVE_READ``) judge a reservation by what the watch
cache has *not* seen change, and a hung watch leaves the cache synced but stale (``raygpu.plan.reclaim.gc``). Before
such a release the sidecar reads the state ConfigMap from the API server, as Kubernetes' own garbage collector
reads an owner live before it deletes a dependent, and writes nothing unless the live object is the one it
planned on, unchanged.
"""

from __future__ import annotations

from raygpu.adapters.kube import KubeAdapter
from raygpu.errors import RayGpuError
from raygpu.model.gc import GcDecision, ReservationRecord, SeenAt
from raygpu.plan.reclaim.gc import changed_since_planned


def confirm_release(kube: KubeAdapter, namespace: str, decision: GcDecision, planned: ReservationRecord | None,
                    seen: dict[str, tuple[str, float | None, SeenAt]], now_s: float) -> str:
    """"" when a live GET of ``decision``'s state ConfigMap shows it as ``planned`` (the cache's copy) showed it:
    the release may go on. Otherwise why not (the read failed, the object is gone or replaced, its heartbeat or
    state moved). A heartbeat found moved counts as seen at ``now_s``: ``seen`` (the sidecar's
    name -> (uid, heartbeat, SeenAt)) is updated, so the heartbeat timeout starts again. Never raises."""
    try:
        raw = kube.get("v1", "ConfigMap", decision.reservation, namespace)
    except RayGpuError as e:
        return f"no live read to confirm it: {e}"
    live = ReservationRecord.from_configmap(raw) if raw is not None else None
    why = changed_since_planned(planned, live)
    uid, _, at = seen.get(decision.reservation, ("", None, None))
    if why and planned is not None and live is not None and at is not None and live.uid == uid \
            and live.heartbeat_at_s != planned.heartbeat_at_s:
        seen[decision.reservation] = (uid, live.heartbeat_at_s, at.model_copy(update={"heartbeat_s": now_s}))
    return why
