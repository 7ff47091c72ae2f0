"""Gang scale-up: which pending placement groups get a gang reservation this cycle (docs/gang-scale-up.md).

``plan_scale_up`` is pure: no I/O, no clock (``now_s`` and what the sidecar remembers are arguments). Its
input is the cycle's observed state (the RayCluster, Ray's nodes and placement groups, the reservation
state ConfigMaps) and the sidecar's memory (when it first saw each placement group pending, which are
backing off); its output is a :class:`ScaleUpPlan`.

A pending placement group (``PENDING``, not ``RESCHEDULING``: a rescheduling one was placed once and Ray
re-places it where its bundles were) gets a reservation when all of these hold:

1. raygpu did not create it: no bundle's label selector names ``raygpu.io/reservation`` (those pin
   themselves to their own reservation, made by their driver);
2. no proven reservation records it (one reservation per placement group: the state ConfigMap's name is
   derived from the placement group id too, so a second create is refused by the API server);
3. the sidecar first saw it pending at least ``grace_s`` ago, and it is not backing off after a failure;
4. it cannot be placed on the Ray nodes that exist now: the pending groups, oldest first (Ray's creation
   time, the GCS's own clock), are fitted one after another (each taking what it fits on) onto the free
   resources of the alive nodes that belong to no reservation (``plan.reclaim.placement``'s search, the
   fit the pending-PG protection uses); one that fits is left to Ray. A search that runs past its own
   steps counts as not fitting (Ray's scheduler does not backtrack that far either);
5. fewer than ``in_flight`` of the cluster's scale-up reservations are waiting to be used;
6. where its bundles carry label selectors, one worker group's Ray labels (the group's ``labels``, which
   KubeRay passes to ``ray start --labels``) satisfy every bundle's selector (Ray's syntax: ``value``,
   ``!value``, ``in(a, b)``, ``!in(a, b)``): the reservation copies that group (the first such, in the
   cluster's order). With none, no reservation is made and the plan says why.

Oldest first; the searches share one budget (``plan.reclaim.placement.Steps``): when it runs out,
no further placement group is judged this cycle (no reservation is made on a guess) and the plan says so.

It also says which reservations to mark ``ready`` (their placement group is CREATED with bundles on their
pods) and which to re-target: Ray may place a placement group of the same shape on pods reserved for
another (it does not know they are reserved). A reservation whose pods hold another placement group's
bundles is re-targeted to that group; the reservation made for that group, if any and unused, is
re-targeted to the one that lost its pods. An unused reservation whose placement group was REMOVED follows
a pending one of the same shape with no reservation (the same creator job's first): Ray Train removes a
workers' placement group that is not ready within its start timeout and creates it again under a new id. Re-targeting only changes which placement group a reservation
waits for; the garbage collector (``plan.reclaim.gc``) never deletes pods that hold a bundle.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from raygpu.model.annotations import ClusterPolicy
from raygpu.model.gang import GangRequest, ReservationState
from raygpu.model.gc import ReservationRecord
from raygpu.model.labels import LABEL_RESERVATION, RESERVATION_GROUP_PREFIX
from raygpu.model.raycluster import RayClusterView
from raygpu.model.scale_up import ScaleUpItem, ScaleUpPlan
from raygpu.model.views import PgState, PlacementGroupView, RayView
from raygpu.plan.common.free_index import FREE, FreeIndex
from raygpu.plan.reclaim.gc import pgs_on_groups
from raygpu.plan.reclaim.placement import UNKNOWN, Steps, find_placement, units

GRACE_S = 10.0  # a placement group pending this long (as the sidecar saw it) may get a reservation
_DONE = {ReservationState.RELEASED.value, ReservationState.ROLLED_BACK.value, ReservationState.FAILED.value}
_ADVANCE = (ReservationState.RESERVED.value, ReservationState.ADMITTED.value, ReservationState.BOUND.value)


def scale_up_name(pg_id: str) -> str:
    """The reservation name for placement group ``pg_id`` (hex): ``pg-<first 16 hex digits>``. Ray's placement
    group ids start with random bytes, so names of one cluster's groups do not meet; the same id always gives
    the same name, so a sidecar that restarts (or lost a create's answer) cannot make a second one."""
    return f"pg-{pg_id[:16].lower()}"


def made_by_raygpu(pg: PlacementGroupView) -> bool:
    """A placement group from ``raygpu.placement_group()``: its bundles are pinned to their own reservation."""
    return any(LABEL_RESERVATION in s for s in pg.bundle_label_selectors)


def plan_scale_up(cluster: RayClusterView, policy: ClusterPolicy, ray: RayView,
                  reservations: Iterable[ReservationRecord], now_s: float, *,
                  first_seen: Mapping[str, float], backoff_until: Mapping[str, float],
                  grace_s: float = GRACE_S, steps: Steps | None = None) -> ScaleUpPlan:
    """Decide this cycle's gang scale-up for ``cluster`` (see the module docstring).

    ``reservations``: the cluster's state ConfigMaps as records; only proven ones
    (``ReservationRecord.owned_by``) count. ``first_seen``: placement group id -> when the sidecar first saw it
    pending; ``backoff_until``: id -> not before then (both the sidecar's clock, like ``now_s``). Never raises.
    """
    if not ray.reachable:
        return ScaleUpPlan(note=f"Ray's view cannot be read ({ray.reason or 'unreachable'}): nothing planned")
    proven = [r for r in reservations if r.owned_by(cluster.name, cluster.uid)]
    held = pgs_on_groups(ray)
    pgs = {pg.pg_id: pg for pg in ray.placement_groups}
    ready, retarget = _ready_and_retarget(proven, held, pgs)
    retargeted = dict(retarget)
    claimed = {retargeted.get(r.name, r.placement_group_id) for r in proven
               if r.placement_group_id and (r.state or "") not in _DONE}
    in_flight = sum(1 for r in proven if r.by_scale_up and (r.state or "") not in _DONE and r.state != "ready"
                    and not held.get(r.group))
    pending = sorted((pg for pg in ray.placement_groups if pg.state is PgState.PENDING and not made_by_raygpu(pg)),
                     key=lambda pg: (pg.created_ms if pg.created_ms is not None else float("inf"), pg.pg_id))
    waiting: list[tuple[str, str]] = []
    budget = Steps() if steps is None else steps
    index = _free_workers(ray)
    reserve: list[ScaleUpItem] = []
    for pg in pending:
        if pg.pg_id in claimed:
            continue  # its reservation exists (or its pods hold it): never a second one
        seen_s = first_seen.get(pg.pg_id, now_s)
        if now_s - seen_s < grace_s:
            waiting.append((pg.pg_id, f"pending {now_s - seen_s:.0f}s, under the {grace_s:g}s grace"))
            continue
        if budget.exhausted:
            waiting.append((pg.pg_id, f"not judged: {budget.spent}"))
            continue
        selectors = [sel for sel in pg.bundle_label_selectors if sel]
        if selectors and not any(n.alive and n.reservation_group is None
                                 and all(label_selector_matches(sel, n.labels) for sel in selectors)
                                 for n in ray.nodes):
            nodes = None  # no Ray node its selectors allow: it cannot be placed now whatever is free
        else:
            us = units(pg)
            nodes = find_placement(us, index, {}, candidates_too=False, steps=budget)
        if nodes == UNKNOWN and budget.exhausted:
            waiting.append((pg.pg_id, f"not judged: {budget.spent}"))
            continue
        # a search past its own steps found no placement: Ray's scheduler, which does not search that far,
        # would not find one either, so it counts as not fitting
        if isinstance(nodes, list):  # (the fit itself does not read label selectors: a node that does not
            # match one is taken as a place for it, which leaves the group to Ray, as the pending-PG protection does)
            for u, n in zip(us, nodes):
                index.less(n, u.demand)
            waiting.append((pg.pg_id, "fits on the workers that exist now: left to Ray"))
            continue
        if backoff_until.get(pg.pg_id, 0.0) > now_s:
            waiting.append((pg.pg_id, f"backing off for {backoff_until[pg.pg_id] - now_s:.0f}s after a failure"))
            continue
        if in_flight + len(reserve) >= policy.scale_up_in_flight:
            waiting.append((pg.pg_id, f"{policy.scale_up_in_flight} reservation(s) in flight already "
                                      "(raygpu.io/gang-scale-up-in-flight)"))
            continue
        template, why = selector_template(pg, cluster)
        if why:
            waiting.append((pg.pg_id, why))
            continue
        reserve.append(ScaleUpItem(pg_id=pg.pg_id, request=request_for(pg, cluster, policy), template=template))
    spent = budget.spent if budget.exhausted else ""
    return ScaleUpPlan(reserve=tuple(reserve), ready=tuple(ready), retarget=tuple(retarget), waiting=tuple(waiting),
                       budget_spent=spent)


def autoscaler_risks(cluster: RayClusterView) -> list[tuple[str, int]]:
    """The worker groups Ray's in-tree autoscaler could grow pod by pod for a GPU placement group: (group,
    maxReplicas) of the GPU groups that are not a reservation's and may still grow, when the RayCluster has
    ``enableInTreeAutoscaling`` and together they may grow by 2 pods or more. Ray's autoscaler v2 plans a
    placement group's pods together but launches them as plain ``replicas`` bumps, which Kubernetes binds
    one by one; when at most one GPU pod can be added in all, nothing can be half-placed. The fix is
    ``maxReplicas: 0`` on GPU templates (gang scale-up copies them whatever their maximum), and at most one
    autoscaled single-GPU group of ``maxReplicas: 1`` (docs/gang-scale-up.md)."""
    if not cluster.autoscaling_enabled:
        return []
    room = [(g.group_name, g.max_replicas, g.max_replicas - g.replicas) for g in cluster.worker_groups
            if g.ray_gpus > 0 and not g.group_name.startswith(RESERVATION_GROUP_PREFIX) and g.max_replicas > g.replicas]
    return [(name, most) for name, most, _ in room] if sum(r for _, _, r in room) >= 2 else []


def selector_template(pg: PlacementGroupView, cluster: RayClusterView) -> tuple[str | None, str]:
    """(worker group, "") whose Ray labels satisfy every non-empty bundle label selector of ``pg`` (the first
    such user group); (None, "") when ``pg`` has none; (None, why) when no group satisfies them all. A
    reservation's own label is never among a user group's labels, so a selector naming it matches nothing
    (``made_by_raygpu`` keeps those out before). Linear in groups x selector entries."""
    selectors = [sel for sel in pg.bundle_label_selectors if sel]
    if not selectors:
        return None, ""
    for g in cluster.worker_groups:
        if g.group_name.startswith(RESERVATION_GROUP_PREFIX):
            continue
        if all(label_selector_matches(sel, g.ray_labels) for sel in selectors):
            return g.group_name, ""
    shown = sorted({f"{k}={v}" for sel in selectors for k, v in sel.items()})
    return None, (f"no worker group's Ray labels satisfy its bundle label selectors ({', '.join(shown)}): "
                  "set them on a worker group's labels")


def label_selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a Ray node with ``labels`` satisfies ``selector`` (Ray's syntax, ``ray._private.label_utils``):
    ``value`` equal; ``!value`` absent or different; ``in(a, b)`` one of; ``!in(a, b)`` absent or none of."""
    for key, raw in selector.items():
        value = str(raw).strip()
        negate = value.startswith("!")
        if negate:
            value = value[1:]
        if value.startswith("in(") and value.endswith(")"):
            allowed = {v.strip() for v in value[3:-1].split(",")}
        else:
            allowed = {value}
        hit = key in labels and labels[key] in allowed
        if hit == negate:
            return False
    return True


def request_for(pg: PlacementGroupView, cluster: RayClusterView, policy: ClusterPolicy) -> GangRequest:
    """The gang request for placement group ``pg``: its bundles and strategy, the cluster's backend and
    queue, the scale-up timeout; no owner job and no guard (its liveness is the placement group)."""
    return GangRequest(name=scale_up_name(pg.pg_id), cluster=cluster.name, namespace=cluster.namespace,
                       bundles=pg.bundles, strategy=pg.strategy, timeout_s=policy.scale_up_timeout_s, guard=False)


def _ready_and_retarget(proven: list[ReservationRecord], held: dict[str, set[str]],
                        pgs: dict[str, PlacementGroupView]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(reservation, pg id) to mark ready; (reservation, pg id) to re-target (see the module docstring)."""
    ready, retarget = [], []
    mine = [r for r in proven if r.by_scale_up and (r.state or "") not in _DONE]
    unused_for = {r.placement_group_id: r for r in mine if r.placement_group_id and not held.get(r.group)}
    for r in sorted(mine, key=lambda r: r.name):
        on_it = held.get(r.group)
        if not on_it:
            continue
        pg = pgs.get(r.placement_group_id or "")
        if r.placement_group_id in on_it:
            if pg is not None and pg.state is PgState.CREATED and r.state in _ADVANCE:
                ready.append((r.name, r.placement_group_id))
            continue
        taker = min(on_it)
        retarget.append((r.name, taker))
        other = unused_for.pop(taker, None)  # the taker's own reservation, unused: it waits for ours instead
        if other is not None and r.placement_group_id and pg is not None and pg.state is PgState.PENDING:
            retarget.append((other.name, r.placement_group_id))
    retarget.extend(_follow_replacements(mine, held, pgs, {pg for _, pg in retarget}))
    return ready, retarget


def _follow_replacements(mine: list[ReservationRecord], held: dict[str, set[str]],
                         pgs: dict[str, PlacementGroupView], taken: set[str]) -> list[tuple[str, str]]:
    """An unused reservation whose placement group is gone follows a pending one of the same shape (bundles
    and strategy) that has no reservation, the same creator job's first, then the oldest: Ray Train removes
    a workers' placement group that is not ready within its start timeout (60 s by default) and creates
    the same one again under a new id; without this its reservation would be released and made again, for
    ever. Linear: the pending placement groups are indexed by shape once."""
    orphans = [r for r in mine if not held.get(r.group) and r.placement_group_id in pgs
               and pgs[r.placement_group_id].state is PgState.REMOVED]  # gone from the table: shape unknown
    if not orphans:
        return []
    claimed = taken | {r.placement_group_id for r in mine if r.placement_group_id}
    by_shape: dict[tuple, list[PlacementGroupView]] = {}
    for pg in sorted(pgs.values(), key=lambda p: (p.created_ms if p.created_ms is not None else float("inf"),
                                                  p.pg_id)):
        if pg.state is PgState.PENDING and pg.pg_id not in claimed and not made_by_raygpu(pg):
            by_shape.setdefault(_shape(pg), []).append(pg)
    out = []
    for r in sorted(orphans, key=lambda r: r.name):
        gone = pgs[r.placement_group_id or ""]
        queue = by_shape.get(_shape(gone))
        if not queue:
            continue
        creator = gone.creator_job_id
        pick = next((p for p in queue if creator and p.creator_job_id == creator), queue[0])
        queue.remove(pick)
        out.append((r.name, pick.pg_id))
    return out


def _shape(pg: PlacementGroupView) -> tuple:
    return (pg.strategy, tuple(tuple(sorted(b.items())) for b in pg.bundles))


def _free_workers(ray: RayView) -> FreeIndex:
    """Free resources of the alive, not draining Ray nodes (the head too) that belong to no reservation, as a FreeIndex
    of role ``free`` (nothing is a candidate here). Reservation nodes are for their own placement groups."""
    rows = []
    for n in sorted(ray.nodes, key=lambda n: n.node_id):
        if not n.alive or n.draining or n.reservation_group:
            continue
        free = {k: v for k, v in n.available.items() if v > 0}
        rows.append((n.node_id, n.labels, free, FREE, "", (), (tuple(sorted(n.labels.items())),
                                                               tuple(sorted(free.items())))))
    return FreeIndex.build(rows)


__all__ = ["GRACE_S", "autoscaler_risks", "plan_scale_up", "request_for", "scale_up_name", "made_by_raygpu"]
