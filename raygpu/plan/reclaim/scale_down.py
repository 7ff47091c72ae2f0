"""Which idle workers of one RayCluster to remove, and why every other one stays.

``plan_reclaim`` is pure: no clock (``now_s`` is an argument), no I/O, no state
between calls; the same input always gives an equal plan. It never deletes the
head, a worker holding a placement-group bundle (on any of its live Ray nodes), a member of a live
reservation, a worker a pending or rescheduling PG needs to fit (``plan.pending``:
a PG that can be placed now can still be placed after the plan, or the workers
stay), or a worker that would take its group below ``minReplicas``. A worker
whose Ray node is DRAINING (or that this sidecar drained, ``policy.drained_pods``)
counts no capacity and needs no idle timeout; every other protection holds. Among the
workers it may delete it prefers, first, idle workers on a node marked unhealthy
(``policy.unhealthy_nodes``: no idle timeout, never kept warm or for a pending PG), then
those whose removal frees whole Kubernetes nodes. Capacity counts only on Ray nodes whose pod exists and is not going away.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container
from itertools import compress
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, NamedTuple

from raygpu.model.labels import LABEL_RESERVATION, RESERVATION_GROUP_PREFIX
from raygpu.model.raycluster import GroupTemplate, RayClusterView
from raygpu.model.reclaim import (
    Decision,
    DecisionAction,
    GroupScaleDown,
    ReclaimPlan,
    ReclaimPolicy,
    ReclaimReason,
)
from raygpu.model.views import K8sPodView, PgState, PlacementGroupView, RayNodeView, Snapshot
from raygpu.plan.common.index import RayJoin, join_ray
from raygpu.plan.reclaim.occupants import GONE_PHASES, candidate_ranks, count_others, defrag_keys, occupants_of, staying_on_node
from raygpu.plan.reclaim.pending import Growth, needed_by_pending_pgs
from raygpu.plan.reclaim.placement import Steps

if TYPE_CHECKING:
    from raygpu.plan.doctor.checks_index import SnapshotIndex

_PENDING = (PgState.PENDING, PgState.RESCHEDULING)
_KEEP, _DELETE = DecisionAction.KEEP, DecisionAction.DELETE
R = ReclaimReason


class _Worker(NamedTuple):  # one per candidate (an idle worker it may delete): a tuple, built in C
    pod: K8sPodView
    group: str
    node: RayNodeView | None  # its live Ray node, None when Ray has none yet
    idle_for_s: float | None  # None: busy or no Ray node
    name: str  # pod.name and pod.node_name, read once in the main pass
    node_name: str | None
    stays: bool  # counts among its node's occupants (``plan.occupants``): on a node, not Succeeded or Failed


_FIRST_TWO = itemgetter(0, 1)
_FIRST_THREE = itemgetter(0, 1, 2)
_BUNDLE_NODE_IDS, _PG_ID = attrgetter("bundle_node_ids"), attrgetter("pg_id")
_WORKER_NAME = itemgetter(4)  # _Worker.name


def plan_reclaim(snapshot: Snapshot, cluster: RayClusterView, policy: ReclaimPolicy, now_s: float, *,
                 index: SnapshotIndex | None = None, search_steps: int | None = None) -> ReclaimPlan:
    """Plan the scale-down of ``cluster``'s idle workers as of ``now_s``.

    Returns a plan with one decision per pod of the cluster and one
    ``GroupScaleDown`` per group that shrinks. Never raises on odd input: a
    worker it cannot judge is kept, with its reason. Pod names are unique in the
    cluster's namespace (Kubernetes' own rule; the views come from the API).

    Cost: one pass over the Ray nodes and one over the pods of the snapshot (the cluster's judged, the
    others only counted on their node), each a plain loop; a pod that is kept costs one dict (its ``Decision``'s fields, made into Decisions
    without validation by ``Decision.typed_dicts``), only the candidates get a tuple, and the pending-PG
    step (``plan.pending``) works on the candidates and nodes that could take a pending bundle.

    ``index``: ``plan.doctor.checks_index.index_snapshot(snapshot)`` when the cycle has it already (it reads the index's
    ``RayJoin``: Ray's live nodes by pod name); else that join is built here.

    ``search_steps``: the budget of the pending-PG step's placement searches, in placement steps (one bundle
    put on one node; ``plan.placement.CYCLE_STEPS`` when None); when it runs out, every idle worker a pending
    bundle could use is kept and the plan's ``search_budget_spent`` says why (docs/reliability.md, "The
    budget rule"). Raises ``ValueError`` when it is not an int >= 0.
    """
    steps = Steps(search_steps)
    ns = cluster.namespace
    groups: dict[str, GroupTemplate] = {}  # by name, the first of a name as cluster.group() finds it
    for g in cluster.worker_groups:
        groups.setdefault(g.group_name, g)
    listed = {g.group_name: frozenset(g.workers_to_delete) for g in reversed(cluster.worker_groups)}

    # 1. Match the pods of this cluster to their live Ray nodes (instance_id == pod name). A pod with several
    #    (Ray restarted inside it, the old node still reported alive) is judged by all of them.
    if index is None:
        join = join_ray(snapshot.ray.nodes)
    elif index.snapshot is not snapshot:
        raise ValueError("index was built from another snapshot")
    else:
        join = index.ray
    ray_by_pod = _ray_by_pod(join)
    held = _bundle_holders(snapshot.ray.placement_groups)
    if join.shared:
        _judge_by_all(join.shared, ray_by_pod, held)
    cname = cluster.name

    # 2. Protections, in order, in one pass over the snapshot's pods (the cluster's judged, the others set
    #    aside for the occupant count); the first that applies is the reason. decisions: pod name -> its
    #    Decision's fields (None: a candidate, decided below), put in name order at the end.
    decisions: dict[str, dict | None] = {}
    pending_pgs = any(pg.state in _PENDING for pg in snapshot.ray.placement_groups)
    hosts: dict[str, RayNodeView] = {}  # plan.pending's counted capacity (built only when a PG is pending)
    candidates: list[_Worker] = []
    going_away: set[str] = set()  # names of pods on their way out (all in the cluster's namespace)
    drained: set[str] = set()  # candidates by drain (Ray's DRAINING state or ours), not by the idle timeout
    unreachable = None if snapshot.ray.reachable else f"Ray view unavailable: {snapshot.ray.reason or 'unknown'}"
    grace_s, live, drained_pods = policy.startup_grace_s, policy.live_reservations, policy.drained_pods
    unhealthy = policy.unhealthy_nodes
    timeouts = {g: policy.idle_timeout_for_s(g) for g in groups}
    warm_hold = {g for g in groups if g in policy.warm_targets and timeouts[g] > 0}
    within_hold: dict[str, int] = defaultdict(int)  # keep-warm group -> idle workers within its hold
    # per group: (its template, the names it lists in workersToDelete, its idle timeout, its reservation)
    per_group = {name: (g, listed[name], timeouts[name], name if name.startswith(RESERVATION_GROUP_PREFIX) else None)
                 for name, g in groups.items()}
    no_group = (None, frozenset(), 0.0, None)
    # Kubernetes node name -> how many of the cluster's pods stay on it (bound, not deleting, not Succeeded
    # or Failed, not on their way out); other pods are counted after the loop (``plan.occupants``)
    occupants: dict[str, int] = {}
    others: list[K8sPodView] = []
    mine = 0
    for pod in snapshot.k8s.pods:  # the hot loop (21,000 pods at 10,000 nodes): plain reads, no call but the dict's
        if pod.ray_cluster != cname or pod.namespace != ns:
            others.append(pod)
            continue
        mine += 1
        name = pod.name
        node = ray_by_pod.get(name)
        if node is None:
            group, idle_for_s = pod.ray_group or "", None
        else:
            group = pod.ray_group or node.node_type or ""
            idle_for_s = None if (since := node.idle_since_s) is None else now_s - since
        g, in_list, timeout_s, group_res = per_group.get(group, no_group)
        head = pod.ray_node_type == "head" or (node is not None and node.is_head)
        deleting, phase, k8s_node = pod.deleting, pod.phase, pod.node_name
        away = g is None or deleting or name in in_list
        if away and not head:
            going_away.add(name)
        elif not deleting and phase not in GONE_PHASES:
            if k8s_node:
                occupants[k8s_node] = occupants.get(k8s_node, 0) + 1
            if pending_pgs and node is not None and not node.draining:
                hosts[node.node_id] = node  # a plan.pending.Host as it is: no copy per Ray node
        if head:
            reason, detail = R.HEAD, "the head is never reclaimed"
        elif g is None:
            reason, detail = R.ALREADY_DELETING, f"group {group!r} is not in the RayCluster spec"
        elif unreachable is not None:
            reason, detail = R.RAY_UNREACHABLE, unreachable
        elif away:
            reason, detail = R.ALREADY_DELETING, "in workersToDelete or being deleted"
        elif (age_s := now_s - pod.created_at_s) < grace_s:
            reason, detail = R.STARTUP_GRACE, f"age {age_s:.0f}s < startup grace {grace_s:.0f}s"
        elif node is not None and held and node.node_id in held:
            reason, detail = R.HOLDS_BUNDLE, f"hosts a bundle of placement group {held[node.node_id]}"
        elif (res := pod.labels.get(LABEL_RESERVATION, group_res)) and (live is None or res in live):
            reason, detail = R.LIVE_RESERVATION, f"member of live reservation {res}"
        elif ((node is not None and node.draining) or name in drained_pods) \
                and (node is None or node.draining or idle_for_s is not None):
            reason = None  # the drain proved it idle: no timeout; the protections above still hold
            drained.add(name)
        elif node is None:
            reason, detail = R.NOT_IDLE_LONG_ENOUGH, "no live Ray node for this pod yet"
        elif idle_for_s is None:
            reason, detail = R.NOT_IDLE_LONG_ENOUGH, "busy"
        elif idle_for_s < timeout_s and not (unhealthy and k8s_node in unhealthy):
            reason, detail = R.NOT_IDLE_LONG_ENOUGH, f"idle {idle_for_s:.0f}s < timeout {timeout_s:.0f}s"
            if group in warm_hold:  # a keep-warm group's hold: this idle worker is warm capacity
                within_hold[group] += 1
        else:
            reason = None
        if reason is None:
            decisions[name] = None
            candidates.append(_Worker(pod, group, node, idle_for_s, name, k8s_node,
                                      bool(k8s_node) and phase not in GONE_PHASES))
        elif node is None:  # _fields, written out: one call less per pod
            decisions[name] = {"pod_name": name, "group": group, "action": _KEEP, "reason": reason,
                               "detail": detail, "k8s_node_name": k8s_node, "ray_node_id": None,
                               "gpus": 0.0, "idle_for_s": idle_for_s}
        else:
            decisions[name] = {"pod_name": name, "group": group, "action": _KEEP, "reason": reason,
                               "detail": detail, "k8s_node_name": k8s_node, "ray_node_id": node.node_id,
                               "gpus": node.total.get("GPU", 0.0), "idle_for_s": idle_for_s}
    candidates.sort(key=_WORKER_NAME)  # name order (stable: pods of one name in snapshot order)
    if len(decisions) < mine:  # two pods of one name (Kubernetes forbids it): count as _occupants says
        occupants = occupants_of(snapshot.k8s.pods, ns, going_away, candidates)
    else:
        count_others(occupants, others, ns, going_away)

    def keep(w: _Worker, reason: ReclaimReason, detail: str) -> None:
        decisions[w.name] = _fields(w, _KEEP, reason, detail)

    # 3. Pending-PG protection (plan.pending): keep the idle candidates that pending or
    # rescheduling PGs need to fit, after using every node that stays. Capacity counts
    # only on a Ray node whose pod exists and is not on its way out. It reads step 4's
    # headroom to prefer candidates the group minimum keeps anyway.
    pending, headroom = _headroom(cluster, decisions)
    budget_spent = ""
    # idle workers on a node marked unhealthy: like drained ones, never kept for a pending PG nor warm
    sick = {w.name for w in candidates if w.node_name in unhealthy} if unhealthy else set()
    unusable = drained | sick if sick else drained
    if sick and pending_pgs:  # their capacity is going: it counts for no pending PG
        for w in candidates:
            if w.name in sick and w.node is not None:
                hosts.pop(w.node.node_id, None)
    if candidates and pending_pgs:
        needed, budget_spent = needed_by_pending_pgs(snapshot.ray.placement_groups, hosts,
                                                     candidate_ranks([w for w in candidates if w.name not in unusable],
                                                                     occupants),
                                                     _spare(candidates, headroom),
                                                     _growth(cluster), steps=steps)
        for w in candidates:
            if w.name in needed:
                keep(w, R.NEEDED_BY_PENDING_PG, needed[w.name])
        candidates = [w for w in candidates if decisions[w.name] is None]

    # 4. The group minimum: at most headroom[group] deletions per group; the rest
    #    are kept with GROUP_MINIMUM.
    # 5. Which ones: idle workers on unhealthy nodes first, then defragmentation order (frees a whole
    #    Kubernetes node first, then the most idle, then by name), so the minimum keeps the others.
    # 5b. Keep-warm groups (plan.warm): drained candidates go first (they take no work), then the last
    #     warm_targets[group] candidates in that order stay; other groups are untouched.
    warm = policy.warm_targets
    if sick:
        order3 = [(w.name not in sick, w.group in warm and w.name not in unusable, key, w)
                  for w, key in zip(candidates, defrag_keys(candidates, occupants))]
        order3.sort(key=_FIRST_THREE)
        candidates = [w for _, _, _, w in order3]
    else:
        order = [(w.group in warm and w.name not in drained, key, w)
                 for w, key in zip(candidates, defrag_keys(candidates, occupants))]
        order.sort(key=_FIRST_TWO)  # the key ends with the pod name: no two are equal
        candidates = [w for _, _, w in order]
    beyond_hold = {g: max(0, n - within_hold[g]) for g, n in warm.items()}  # idle workers within the hold are warm
    allowed = _warm_allowance(candidates, headroom, beyond_hold, unusable)
    to_delete: dict[str, list[_Worker]] = defaultdict(list)
    for w in candidates:
        g = groups[w.group]
        if len(to_delete[w.group]) < allowed[w.group]:
            to_delete[w.group].append(w)
        elif len(to_delete[w.group]) < headroom[w.group]:
            keep(w, R.KEEP_WARM, f"warm target {policy.warm_targets[w.group]} of group {w.group}: "
                 f"{policy.warm_reasons.get(w.group, '')}")
        else:
            keep(w, R.GROUP_MINIMUM, f"replicas {g.replicas} - pending deletions {pending[w.group]}"
                 f" - {len(to_delete[w.group])} planned would go below minReplicas {g.min_replicas}")

    # 6. Emit one GroupScaleDown per shrinking group, in spec order; names sorted.
    scale_downs = []
    idle_details: dict[tuple[str, float | None], str] = {}  # many deletions share one text
    for index, g in enumerate(cluster.worker_groups):
        chosen = sorted(to_delete.get(g.group_name, []), key=_WORKER_NAME)
        if not chosen:
            continue
        for w in chosen:
            if w.name in drained:
                detail, reason = _drained(w, policy), R.DRAINED
            elif w.name in sick:
                reason, detail = R.IDLE, (f"idle {w.idle_for_s:.0f}s on node {w.node_name}, marked unhealthy: "
                                          f"{unhealthy[w.node_name]}")
            else:
                reason, detail = R.IDLE, idle_details.get((w.group, w.idle_for_s))
                if detail is None:
                    detail = idle_details[(w.group, w.idle_for_s)] = _idle_detail(w, policy)
            decisions[w.name] = _fields(w, _DELETE, reason, detail)
        added = tuple(w.name for w in chosen)
        scale_downs.append(GroupScaleDown(
            group_name=g.group_name, group_index=index, old_replicas=g.replicas,
            replicas=max(0, g.replicas - len(added)),
            workers_to_delete=g.workers_to_delete + added, added=added))
    deleted = [w for ws in to_delete.values() for w in ws]
    gone = staying_on_node(deleted)  # deleted pods that counted among their node's occupants
    freed = sorted({w.node_name for w in deleted if w.node_name
                    and occupants.get(w.node_name, 0) == gone.get(w.node_name, 0)})
    on_ray = [w for w in deleted if w.node]
    gpus = [w.node.total.get("GPU", 0.0) for w in on_ray]  # RayNodeView.gpu_total, read once per deletion
    plan = ReclaimPlan(
        cluster=cluster.name, namespace=cluster.namespace,
        cluster_resource_version=cluster.resource_version, planned_at_s=now_s,
        to_delete=tuple(scale_downs),
        decisions=(),
        freed_k8s_nodes=tuple(freed),
        reclaimed_gpus=sum(gpus),  # the same terms in the same order as before: the same sums
        idle_gpu_s=sum([g * (w.idle_for_s or 0.0) for g, w in zip(gpus, on_ray)]),
        search_budget_spent=budget_spent,
    )
    # every pod has its fields by now, in name order; made Decisions here, and not validated once more one
    # by one inside the plan (model_copy does not validate: they are Decisions already)
    return plan.model_copy(update={"decisions": Decision.typed_dicts([decisions[n] for n in sorted(decisions)])})


def _ray_by_pod(join: RayJoin) -> dict[str, RayNodeView]:
    """Pod name -> its live Ray node (``instance_id`` == pod name); of two live nodes with one instance id,
    the larger node id (as a dict built in node id order would keep; ``_judge_by_all`` then folds the others
    in). The join's own map when the instance
    ids are unique (the usual case), else a plain loop."""
    if join.unique:
        return join.by_instance
    out: dict[str, RayNodeView] = {}
    for n in join.with_instance():  # two live nodes claim one pod: keep the larger node id, whatever the order
        if (cur := out.get(n.instance_id)) is None or n.node_id >= cur.node_id:
            out[n.instance_id] = n
    return out


def _judge_by_all(shared: dict[str, tuple[RayNodeView, ...]], ray_by_pod: dict[str, RayNodeView],
                  held: dict[str, str]) -> None:
    """Make each pod with several live Ray nodes (``RayJoin.shared``) judged by all of them, in place: the
    node it is matched to (``ray_by_pod``, a fresh dict when ids are shared) is busy when any of them is (else
    idle since the latest of them) and DRAINING only when none is busy; it holds a bundle (``held``) when any
    of them does. The decision still names the matched node."""
    for pod, nodes in shared.items():
        node = ray_by_pod[pod]
        if node.node_id not in held:
            for n in nodes:
                if n.node_id in held:
                    held[node.node_id] = f"{held[n.node_id]} on this pod's other Ray node {n.node_id}"
                    break
        busy = any(n.idle_since_s is None for n in nodes)
        since = None if busy else max(n.idle_since_s for n in nodes)  # type: ignore[type-var]
        if since != node.idle_since_s or (busy and node.draining):
            ray_by_pod[pod] = node.model_copy(update={"idle_since_s": since, "draining": node.draining and not busy})


def _idle_detail(w: _Worker, policy: ReclaimPolicy) -> str:
    if w.group in policy.warm_targets:
        return f"idle {w.idle_for_s:.0f}s, beyond warm target {policy.warm_targets[w.group]}"
    return f"idle {w.idle_for_s:.0f}s >= timeout {policy.idle_timeout_for_s(w.group):.0f}s"


def _warm_allowance(candidates: list[_Worker], headroom: dict[str, int], warm: dict[str, int],
                    drained: set[str]) -> dict[str, int]:
    """Per group, deletions allowed: the headroom, and for a keep-warm group at most its drained candidates
    plus its other candidates less its warm target (idle workers the group minimum keeps count as warm)."""
    usable: dict[str, int] = defaultdict(int)
    gone: dict[str, int] = defaultdict(int)
    for w in candidates:
        (gone if w.name in drained else usable)[w.group] += 1
    return {g: min(h, gone[g] + max(0, usable[g] - warm[g])) if g in warm else h for g, h in headroom.items()}


def _spare(candidates: list[_Worker], headroom: dict[str, int]) -> dict[str, int]:
    """Per group: candidates the group minimum keeps anyway (> 0), the planner's first choice to protect."""
    spare = {g: -n for g, n in headroom.items()}
    for w in candidates:
        spare[w.group] = spare.get(w.group, 0) + 1
    return spare


def _growth(cluster: RayClusterView) -> list[Growth]:
    return [Growth(g.group_name, max(0, g.max_replicas - g.replicas), g.ray_gpus, g.ray_cpus, g.ray_labels)
            for g in cluster.worker_groups]


def _drained(w: _Worker, policy: ReclaimPolicy) -> str:
    """Why ``w`` counts as drained ("" when it does not): its Ray node is DRAINING, or this sidecar drained
    it and the patch after the drain did not land (its Ray node is then gone, or back idle after the
    container restarted: the drain before the next patch is again the proof)."""
    if w.node is not None and w.node.draining:
        return "its Ray node is DRAINING: Ray places nothing new there"
    if w.pod.name in policy.drained_pods:
        return "drained by this sidecar in an earlier cycle; its patch did not land"
    return ""


def _fields(w: _Worker, action: DecisionAction, reason: ReclaimReason, detail: str) -> dict:
    """The fields of the candidate's Decision, in field order (``Decision.typed_dicts``); its pod's name and node
    name as the main pass read them."""
    node = w.node
    return {"pod_name": w.name, "group": w.group, "action": action, "reason": reason, "detail": detail,
            "k8s_node_name": w.node_name, "ray_node_id": None if node is None else node.node_id,
            "gpus": 0.0 if node is None else node.total.get("GPU", 0.0), "idle_for_s": w.idle_for_s}


def _bundle_holders(pgs: tuple[PlacementGroupView, ...]) -> dict[str, str]:
    """Ray node id -> the first (by id) live placement group with a bundle on it."""
    held: dict[str, str] = {}
    # only the PGs with a bundle on a node are sorted (a backlog is thousands of PGs with none), in C
    for pg in sorted(compress(pgs, map(any, map(_BUNDLE_NODE_IDS, pgs))), key=_PG_ID):
        if pg.state is not PgState.REMOVED:
            for node_id in pg.bundle_node_ids:
                if node_id:
                    held.setdefault(node_id, pg.name or pg.pg_id)
    return held


def _headroom(cluster: RayClusterView, pod_names: Container[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per group: (deletions still pending, deletions the minimum still allows).

    Headroom = replicas - pending - minReplicas, where pending counts the listed
    workersToDelete that still exist as pods. Counting them even when their writer
    already lowered replicas (KubeRay's autoscaler does) is deliberate: it can only
    keep more workers, for one cycle, never go below the minimum while the operator
    catches up.
    """
    pending = {g.group_name: sum(1 for n in set(g.workers_to_delete) if n in pod_names)
               for g in cluster.worker_groups}
    headroom = {g.group_name: max(0, g.replicas - pending[g.group_name] - g.min_replicas)
                for g in cluster.worker_groups}
    return pending, headroom
