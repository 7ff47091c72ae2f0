"""Which gang reservations to release because nobody will ever release them.

``plan_gc`` is pure: no clock (``now_s`` is an argument), no I/O, no state
between calls; what the sidecar saw when (``seen``, ``orphan_groups``) is an
input, measured by the caller on the same clock as ``now_s``.

Proof first. A state ConfigMap that is not provably raygpu's
(``ReservationRecord.owned_by``: labels and an ownerReference to this
RayCluster's uid) is kept as ``Unproven`` and never touched; the group of a
proven one is written only when it is provably raygpu's too
(``is_reservation_group``: pod template label ``raygpu.io/reservation`` =
its own name), otherwise only the ConfigMap goes. A proven reservation is
released, first rule that applies:

1. its state is terminal (``released``/``rolled_back``): only leftovers remain;
2. its state is ``failed``: the rollback never finished;
3. it recorded a Ray placement group that is REMOVED or absent from Ray's table
   (only when Ray's view is reachable);
4. Ray's job table says the job that owns it is dead (only when the caller
   could read the job table: ``jobs`` is not None);
5. its heartbeat annotation has not changed for more than ``heartbeat_timeout_s``
   as the *sidecar* saw it (``SeenAt.heartbeat_s``): the driver's clock is never
   compared with the sidecar's, and a restarted sidecar waits the full timeout.
   Only where Ray gives no word of life: a reservation whose owner job Ray's job
   table says is alive, or whose recorded placement group Ray holds (any state
   but REMOVED; raygpu's PGs are not detached, Ray removes them with their job),
   is kept whatever its heartbeat (``RAY_SAYS_ALIVE``): a driver that lost API
   access (expired token, revoked RoleBinding, partition) keeps its running gang.
   The heartbeat is evidence only where Ray cannot be read or knows nothing of
   the job (rules 3 and 4 have already released it where Ray says it is gone);
6. it is still not ``ready`` ``heartbeat_timeout_s`` after its deadline, the
   deadline carried onto the sidecar's clock skew-free: the driver wrote the
   time left (``deadline_at - heartbeat_at``, both its clock) when it wrote the
   heartbeat the sidecar saw at ``SeenAt.heartbeat_s``.

A reservation the sidecar's gang scale-up made (``ReservationRecord.by_scale_up``) has no driver and no
heartbeat: rules 4 and 5 never apply to it. After rules 1 and 2 it is judged by its placement group in Ray's
table (``_scale_up_verdict``): kept while a bundle of any placement group sits on its pods (``InUse``: never
deleted under a bundle) or while Ray cannot be read; released when its placement group is gone (rule 3),
CREATED on other nodes (``PlacedElsewhere``), still pending past the reservation's deadline (``TimedOut``,
carried onto the sidecar's clock as in rule 6), or left half-made by a sidecar that stopped while making it
(``Incomplete``: still ``planned`` with no worker group, ``INCOMPLETE_AFTER_S`` after this sidecar first saw it).

Groups without a proven state ConfigMap (``orphan_groups``) are kept as
``Unproven`` unless they are provably raygpu's *and* this sidecar saw their
proven state ConfigMap before it went (a lost state cannot be told from one
never made otherwise); such a group, orphaned for more than
``heartbeat_timeout_s``, is scaled to zero (``StateLost``), never removed:
zero replicas frees the GPUs, and the spec stays for a human to judge.

The caller must read the reservations *before* Ray's view: a PG id recorded on
a ConfigMap is then always older than the PG table it is checked against, so a
PG created a moment ago is never taken for gone.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from raygpu.model.gang import ReservationState
from raygpu.model.gc import (DEFAULT_HEARTBEAT_TIMEOUT_S, GcAction, GcDecision, GcPlan, GcReason, OrphanGroup,
                             ReservationRecord, SeenAt, is_reservation_group)
from raygpu.model.labels import LABEL_RESERVATION
from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.model.views import PgState, RayView

_TERMINAL = {ReservationState.RELEASED.value, ReservationState.ROLLED_BACK.value}
_KEEP = frozenset({GcReason.LIVE, GcReason.RAY_SAYS_ALIVE, GcReason.IN_USE})  # the verdicts of _verdict that keep
INCOMPLETE_AFTER_S = 30.0  # a scale-up reservation still planned with no worker group that long was abandoned


def pgs_on_groups(ray_view: RayView) -> dict[str, set[str]]:
    """Reservation worker group -> the placement groups (not REMOVED) with a bundle on one of its alive Ray
    nodes (``RayNodeView.reservation_group``). Linear."""
    group_of = {n.node_id: g for n in ray_view.nodes if n.alive and (g := n.reservation_group)}
    out: dict[str, set[str]] = {}
    if not group_of:
        return out
    for pg in ray_view.placement_groups:
        if pg.state is PgState.REMOVED:
            continue
        for nid in pg.bundle_node_ids:
            group = group_of.get(nid) if nid else None
            if group is not None:
                out.setdefault(group, set()).add(pg.pg_id)
    return out


def plan_gc(reservations: Iterable[ReservationRecord], ray_view: RayView, now_s: float, *,
            cluster: RayClusterView, jobs: Mapping[str, bool] | None = None,
            heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
            seen: Mapping[str, SeenAt] | None = None,
            orphan_groups: Mapping[str, OrphanGroup] | None = None) -> GcPlan:
    """Decide, for each reservation of ``cluster``, keep or release (with the first reason that applies).

    ``jobs`` maps Ray job id (hex) -> alive; None when the job table could not be
    read (rule 4 is skipped). ``seen`` maps a state ConfigMap's name -> when the
    sidecar saw it (a name missing counts as first seen at ``now_s``: never
    released on heartbeat or deadline). ``orphan_groups`` maps a worker group
    without a state ConfigMap -> how the sidecar saw it. Never raises on odd
    input: an unknown state or a missing annotation only skips the rules that
    need it.
    """
    pgs = {pg.pg_id: pg for pg in ray_view.placement_groups}
    groups = {g.group_name: g for g in reversed(cluster.worker_groups)}  # indexed once: the first of a name wins
    seen = seen or {}
    held = pgs_on_groups(ray_view)
    decisions, proven_groups = [], set()
    for r in reservations:
        owned_group = groups.get(r.group)
        group_owned = owned_group is not None and is_reservation_group(owned_group)
        missing = r.missing_proof(cluster.name, cluster.uid)
        if missing:
            decisions.append(GcDecision(reservation=r.name, group=r.group, action=GcAction.KEEP,
                                        reason=GcReason.UNPROVEN, detail=f"not provably raygpu's ({missing}): "
                                        "never touched"))
            continue
        proven_groups.add(r.group)
        at = seen.get(r.name) or SeenAt(first_s=now_s, heartbeat_s=now_s)
        if r.by_scale_up and (r.state or "").strip().lower() not in _TERMINAL | {ReservationState.FAILED.value}:
            reason, detail = _scale_up_verdict(r, at, owned_group is not None, held.get(r.group, set()), ray_view,
                                               pgs, now_s)
        else:
            reason, detail = _verdict(r, at, ray_view, pgs, jobs, now_s, heartbeat_timeout_s)
        keep = reason in _KEEP
        if not keep and not group_owned:
            detail += (f"; worker group {r.group} is left alone (absent, or its pod template lacks "
                       f"{LABEL_RESERVATION}={r.group})")
        action = GcAction.KEEP if keep else GcAction.RELEASE
        decisions.append(GcDecision(reservation=r.name, group=r.group, action=action, reason=reason, detail=detail,
                                    group_owned=group_owned, state_uid=r.uid))
    for group, orphan in sorted((orphan_groups or {}).items()):
        if group not in proven_groups:
            decisions.append(_orphan(group, orphan, groups.get(group), now_s, heartbeat_timeout_s))
    decisions.sort(key=lambda d: (d.reservation, d.group))
    return GcPlan(planned_at_s=now_s, decisions=tuple(decisions),
                  to_release=tuple(d for d in decisions if d.action is not GcAction.KEEP),
                  reservation_groups=frozenset(d.group for d in decisions if d.group))


def _orphan(group: str, orphan: OrphanGroup, spec: GroupTemplate | None, now_s: float,
            timeout_s: float) -> GcDecision:
    """The verdict on worker group ``group`` (``spec``: its template, None when absent) without a proven state
    ConfigMap: scale to zero only with both proofs."""
    owned = spec is not None and is_reservation_group(spec)

    def keep(reason: GcReason, detail: str) -> GcDecision:
        return GcDecision(reservation=group, group=group, action=GcAction.KEEP, reason=reason, detail=detail,
                          group_owned=owned)
    if not owned:
        return keep(GcReason.UNPROVEN, f"worker group {group} has no state object and its pod template lacks "
                    f"{LABEL_RESERVATION}={group}: not raygpu's, never touched")
    if not orphan.state_seen:
        return keep(GcReason.UNPROVEN, f"worker group {group} carries raygpu's label but this sidecar never saw "
                    "its state object: a lost state cannot be told from one not yet made; left to a human")
    lost_s = now_s - orphan.since_s
    assert spec is not None
    if spec.replicas == 0 and spec.min_replicas == 0:
        return keep(GcReason.STATE_LOST, f"the state object of worker group {group} is gone; the group is at zero "
                    "replicas: nothing more to do (it is never removed)")
    if lost_s <= timeout_s:
        return keep(GcReason.LIVE, f"state object of {group} gone for {lost_s:.0f}s: waiting {timeout_s:.0f}s "
                    "before taking it for lost")
    return GcDecision(reservation=group, group=group, action=GcAction.SCALE_TO_ZERO, reason=GcReason.STATE_LOST,
                      group_owned=True, detail=f"the state object of worker group {group} has been gone for "
                      f"{lost_s:.0f}s > {timeout_s:.0f}s: scaling it to zero (never removed)")


def _verdict(r: ReservationRecord, at: SeenAt, ray_view: RayView, pgs: dict, jobs: Mapping[str, bool] | None,
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
    quiet_s = now_s - at.heartbeat_s
    alive = _rays_word_of_life(r, ray_view, pgs, jobs)
    if quiet_s > timeout_s and not alive:
        what = "heartbeat" if r.heartbeat_at_s is not None else "no heartbeat annotation"
        return GcReason.HEARTBEAT_LOST, (f"{what} unchanged for {quiet_s:.0f}s > {timeout_s:.0f}s "
                                         "(measured on the sidecar's clock) and Ray gives no word of its job")
    if r.deadline_at_s is not None and r.heartbeat_at_s is not None and state != ReservationState.READY.value:
        deadline_s = at.heartbeat_s + (r.deadline_at_s - r.heartbeat_at_s)  # on the sidecar's clock
        if now_s > deadline_s + timeout_s:
            return GcReason.DEADLINE_MISSED, (f"state {state or 'unknown'} {now_s - deadline_s:.0f}s after its "
                                              "deadline; the driver's watchdog never rolled it back")
    if quiet_s > timeout_s:
        return GcReason.RAY_SAYS_ALIVE, (f"state {state or 'unknown'}, heartbeat unchanged for {quiet_s:.0f}s > "
                                         f"{timeout_s:.0f}s, but {alive}: kept on Ray's word (its driver may have "
                                         "lost access to the API server)")
    return GcReason.LIVE, f"state {state or 'unknown'}, heartbeat unchanged for {quiet_s:.0f}s"


def _scale_up_verdict(r: ReservationRecord, at: SeenAt, group_in_spec: bool, held: set[str], ray_view: RayView,
                      pgs: dict, now_s: float) -> tuple[GcReason, str]:
    """A gang scale-up reservation, not terminal nor failed: judged by Ray's placement group table only."""
    if held:
        shown = ", ".join(sorted(held)[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        return GcReason.IN_USE, f"bundles of placement group(s) {shown} sit on its pods"
    if not ray_view.reachable:
        return GcReason.LIVE, f"Ray's view cannot be read ({ray_view.reason or 'unreachable'}): kept until it can"
    pg_id = r.placement_group_id
    pg = pgs.get(pg_id) if pg_id else None
    if pg is None:
        return GcReason.PLACEMENT_GROUP_GONE, (f"placement group {pg_id} is not in Ray's table" if pg_id
                                               else "it names no placement group")
    if pg.state is PgState.REMOVED:
        return GcReason.PLACEMENT_GROUP_GONE, f"placement group {pg_id} is REMOVED"
    if pg.state is PgState.CREATED:
        return GcReason.PLACED_ELSEWHERE, (f"placement group {pg_id} is CREATED on other nodes and no bundle sits "
                                           "on its pods")
    state = (r.state or "").strip().lower()
    if state == ReservationState.PLANNED.value and not group_in_spec and now_s - at.first_s > INCOMPLETE_AFTER_S:
        return GcReason.INCOMPLETE, (f"still planned with no worker group {now_s - at.first_s:.0f}s after this "
                                     "sidecar first saw it: the sidecar that made it stopped half-way")
    if r.deadline_at_s is not None and r.heartbeat_at_s is not None:
        deadline_s = at.heartbeat_s + (r.deadline_at_s - r.heartbeat_at_s)  # on this sidecar's clock
        if now_s > deadline_s:
            return GcReason.TIMED_OUT, (f"placement group {pg_id} still {pg.state.value} "
                                        f"{now_s - deadline_s:.0f}s past the reservation's deadline: rolled back")
        return GcReason.LIVE, f"waiting for placement group {pg_id} ({pg.state.value}), {deadline_s - now_s:.0f}s left"
    return GcReason.LIVE, f"waiting for placement group {pg_id} ({pg.state.value})"


def _rays_word_of_life(r: ReservationRecord, ray_view: RayView, pgs: dict, jobs: Mapping[str, bool] | None) -> str:
    """Why Ray says the reservation's driver job lives ("" when Ray gives no such word).

    Its owner job alive in the job table, or its recorded placement group held in Ray's table (any state but
    REMOVED: raygpu's placement groups are never detached, so Ray removes them with their job). Called after
    the rules that release on Ray's word (PG gone, job dead), so a dead job never reaches here.
    """
    if jobs is not None and r.owner_job and jobs.get(r.owner_job) is True:
        return f"Ray says its job {r.owner_job} is alive"
    pg = pgs.get(r.placement_group_id) if ray_view.reachable and r.placement_group_id else None
    if pg is not None and pg.state is not PgState.REMOVED:
        return f"Ray holds its placement group {r.placement_group_id} ({pg.state.value})"
    return ""


# The rules that judge a reservation by what the watch cache has *not* seen change. A watch that hangs without
# an answer, or a connection that died silently, leaves the cache synced but stale until its read deadline
# (kube_watch.WATCH_READ_TIMEOUT_S, longer than the heartbeat timeout): on the cache alone, a live driver's
# heartbeat would read as lost. So a release for these reasons is first confirmed by a live read.
NEEDS_LIVE_READ = frozenset({GcReason.HEARTBEAT_LOST, GcReason.DEADLINE_MISSED})


def changed_since_planned(planned: ReservationRecord | None, live: ReservationRecord | None) -> str:
    """Why a release judged on ``planned`` (the watch cache's copy of a state ConfigMap) must not be written,
    given ``live`` (the same ConfigMap read from the API server just now; None: not found). "" when the live
    object is the one planned on, with the same heartbeat and state: the release is confirmed."""
    if planned is None:
        return "the cache no longer holds it"
    if live is None:
        return "the state ConfigMap is gone: nothing to release"
    if live.uid != planned.uid:
        return f"another object has its name now (uid {live.uid}, not {planned.uid})"
    if live.heartbeat_at_s != planned.heartbeat_at_s:
        return (f"its heartbeat moved ({planned.heartbeat_at_s} -> {live.heartbeat_at_s}) where the watch cache "
                "did not see it: the cache is behind")
    if live.state != planned.state:
        return f"its state moved ({planned.state} -> {live.state}) where the watch cache did not see it"
    return ""
