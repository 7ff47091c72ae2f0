"""Which gang reservations to release because nobody will ever release them.

``plan_gc`` is pure: no clock (``now_s`` is an argument), no I/O, no state
between calls. A reservation is released, first rule that applies:

1. its state is terminal (``released``/``rolled_back``): only leftovers remain;
2. its state is ``failed``: the rollback never finished;
3. it recorded a Ray placement group that is REMOVED or absent from Ray's table
   (only when Ray's view is reachable);
4. Ray's job table says the job that owns it is dead (only when the caller
   could read the job table: ``jobs`` is not None);
5. no heartbeat for more than ``heartbeat_timeout_s`` (the driver was killed;
   a reservation that never beat counts from its creation);
6. it is still not ``ready`` ``heartbeat_timeout_s`` after its deadline (the
   driver's watchdog should have rolled it back by then).

Besides the state objects, ``orphan_groups`` names reservation worker groups
(``rg-*``) of the RayCluster that have no state object, with when the caller
first saw them so: one orphaned for more than ``heartbeat_timeout_s`` is
released too (``StateLost``). The wait covers a watch cache that shows a new
group before its ConfigMap (the driver creates the ConfigMap first).

Everything else is live. The caller must read the reservations *before* Ray's
view: a PG id recorded on a ConfigMap is then always older than the PG table it
is checked against, so a PG created a moment ago is never taken for gone.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from raygpu.model.gang import ReservationState
from raygpu.model.gc import DEFAULT_HEARTBEAT_TIMEOUT_S, GcAction, GcDecision, GcPlan, GcReason, ReservationRecord
from raygpu.model.views import PgState, RayView

_TERMINAL = {ReservationState.RELEASED.value, ReservationState.ROLLED_BACK.value}


def plan_gc(reservations: Iterable[ReservationRecord], ray_view: RayView, now_s: float, *,
            jobs: Mapping[str, bool] | None = None,
            heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
            orphan_groups: Mapping[str, tuple[str, float]] | None = None) -> GcPlan:
    """Decide, for each reservation, keep or release (with the first reason that applies).

    ``jobs`` maps Ray job id (hex) -> alive; None when the job table could not be
    read (rule 4 is skipped). ``orphan_groups`` maps a reservation group without
    a state object -> (the state object's expected name, first seen orphaned at).
    Never raises on odd input: an unknown state or a missing annotation only
    skips the rules that need it.
    """
    reservations = list(reservations)
    pgs = {pg.pg_id: pg for pg in ray_view.placement_groups}
    decisions = []
    for r in reservations:
        reason, detail = _verdict(r, ray_view, pgs, jobs, now_s, heartbeat_timeout_s)
        action = GcAction.KEEP if reason is GcReason.LIVE else GcAction.RELEASE
        decisions.append(GcDecision(reservation=r.name, group=r.group, action=action, reason=reason, detail=detail))
    known = {r.group for r in reservations}
    for group, (name, since_s) in (orphan_groups or {}).items():
        if group in known:
            continue
        lost_s = now_s - since_s
        if lost_s > heartbeat_timeout_s:
            decisions.append(GcDecision(reservation=name, group=group, action=GcAction.RELEASE,
                                        reason=GcReason.STATE_LOST, detail=f"worker group {group} has had no state "
                                        f"object ({name}) for {lost_s:.0f}s > {heartbeat_timeout_s:.0f}s"))
        else:
            decisions.append(GcDecision(reservation=name, group=group, action=GcAction.KEEP, reason=GcReason.LIVE,
                                        detail=f"no state object {name} for {lost_s:.0f}s: waiting "
                                        f"{heartbeat_timeout_s:.0f}s before taking it for lost"))
    decisions.sort(key=lambda d: d.reservation)
    return GcPlan(planned_at_s=now_s, decisions=tuple(decisions),
                  to_release=tuple(d for d in decisions if d.action is GcAction.RELEASE),
                  reservation_groups=frozenset(d.group for d in decisions))


def _verdict(r: ReservationRecord, ray_view: RayView, pgs: dict, jobs: Mapping[str, bool] | None,
             now_s: float, timeout_s: float) -> tuple[GcReason, str]:
    state = (r.state or "").strip().lower()
    if state in _TERMINAL:
        return GcReason.TERMINAL, f"state {state}: deleting what is left"
    if state == ReservationState.FAILED.value:
        return GcReason.FAILED, "state failed and not rolled back: finishing the rollback"
    if ray_view.reachable and r.placement_group_id:
        pg = pgs.get(r.placement_group_id)
        if pg is None:
            return GcReason.PLACEMENT_GROUP_GONE, f"placement group {r.placement_group_id} is not in Ray's table"
        if pg.state is PgState.REMOVED:
            return GcReason.PLACEMENT_GROUP_GONE, f"placement group {r.placement_group_id} is REMOVED"
    if jobs is not None and r.owner_job and jobs.get(r.owner_job) is False:
        return GcReason.OWNER_JOB_DEAD, f"owner job {r.owner_job} is dead"
    beat_s = r.heartbeat_at_s if r.heartbeat_at_s is not None else r.created_at_s
    if now_s - beat_s > timeout_s:
        what = "heartbeat" if r.heartbeat_at_s is not None else "heartbeat (none since creation)"
        return GcReason.HEARTBEAT_LOST, f"last {what} {now_s - beat_s:.0f}s ago > {timeout_s:.0f}s"
    if (r.deadline_at_s is not None and state != ReservationState.READY.value
            and now_s > r.deadline_at_s + timeout_s):
        return GcReason.DEADLINE_MISSED, (f"state {state or 'unknown'} {now_s - r.deadline_at_s:.0f}s after its "
                                          "deadline; the driver's watchdog never rolled it back")
    return GcReason.LIVE, f"state {state or 'unknown'}, last heartbeat {now_s - beat_s:.0f}s ago"
