"""Which idle workers of one RayCluster to remove, and why every other one stays.

``plan_reclaim`` is pure: no clock (``now_s`` is an argument), no I/O, no state
between calls; the same input always gives an equal plan. It never deletes the
head, a worker holding a placement-group bundle, a member of a live
reservation, a worker a pending or rescheduling PG needs to fit, or a worker
that would take its group below ``minReplicas``. Among the workers it may
delete it prefers those whose removal frees whole Kubernetes nodes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from raygpu.model.labels import LABEL_RESERVATION, RESERVATION_GROUP_PREFIX
from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import (
    Decision,
    DecisionAction,
    GroupScaleDown,
    ReclaimPlan,
    ReclaimPolicy,
    ReclaimReason,
)
from raygpu.model.views import K8sPodView, PgState, PlacementGroupView, RayNodeView, Snapshot

_EPS = 1e-9
_PENDING = (PgState.PENDING, PgState.RESCHEDULING)
_GONE_PHASES = ("Succeeded", "Failed")
R = ReclaimReason


@dataclass(frozen=True)
class _Worker:
    pod: K8sPodView
    group: str
    node: RayNodeView | None  # its live Ray node, None when Ray has none yet
    idle_for_s: float | None  # None: busy or no Ray node


def plan_reclaim(snapshot: Snapshot, cluster: RayClusterView, policy: ReclaimPolicy, now_s: float) -> ReclaimPlan:
    """Plan the scale-down of ``cluster``'s idle workers as of ``now_s``.

    Returns a plan with one decision per pod of the cluster and one
    ``GroupScaleDown`` per group that shrinks. Never raises on odd input: a
    worker it cannot judge is kept, with its reason.
    """
    kept: dict[str, Decision] = {}

    def keep(w: _Worker, reason: ReclaimReason, detail: str) -> None:
        kept[w.pod.name] = _decision(w, DecisionAction.KEEP, reason, detail)

    # 1. Match the pods of this cluster to their live Ray nodes (instance_id == pod name).
    ray_by_pod = {n.instance_id: n for n in sorted(snapshot.ray.nodes, key=lambda n: n.node_id)
                  if n.alive and n.instance_id}
    pods = sorted((p for p in snapshot.k8s.pods
                   if p.ray_cluster == cluster.name and p.namespace == cluster.namespace),
                  key=lambda p: p.name)
    workers: list[_Worker] = []
    going_away: set[tuple[str, str]] = set()  # (namespace, name) of pods on their way out
    for pod in pods:
        node = ray_by_pod.get(pod.name)
        idle_for_s = now_s - node.idle_since_s if node and node.idle_since_s is not None else None
        w = _Worker(pod, pod.ray_group or (node.node_type if node else None) or "", node, idle_for_s)
        if pod.is_head or (node is not None and node.is_head):
            keep(w, R.HEAD, "the head is never reclaimed")
        elif cluster.group(w.group) is None:
            keep(w, R.ALREADY_DELETING, f"group {w.group!r} is not in the RayCluster spec")
            going_away.add(_key(pod))
        else:
            workers.append(w)
            if pod.deleting or pod.name in cluster.group(w.group).workers_to_delete:
                going_away.add(_key(pod))

    # 2. Protections, in order; the first that applies is the reason.
    held = _bundle_holders(snapshot.ray.placement_groups)
    candidates: list[_Worker] = []
    for w in workers:
        if not snapshot.ray.reachable:
            keep(w, R.RAY_UNREACHABLE, f"Ray view unavailable: {snapshot.ray.reason or 'unknown'}")
        elif _key(w.pod) in going_away:
            keep(w, R.ALREADY_DELETING, "in workersToDelete or being deleted")
        elif (age_s := now_s - w.pod.created_at_s) < policy.startup_grace_s:
            keep(w, R.STARTUP_GRACE, f"age {age_s:.0f}s < startup grace {policy.startup_grace_s:.0f}s")
        elif w.node is not None and w.node.node_id in held:
            keep(w, R.HOLDS_BUNDLE, f"hosts a bundle of placement group {held[w.node.node_id]}")
        elif (res := _reservation(w)) and (policy.live_reservations is None or res in policy.live_reservations):
            keep(w, R.LIVE_RESERVATION, f"member of live reservation {res}")
        elif w.node is None:
            keep(w, R.NOT_IDLE_LONG_ENOUGH, "no live Ray node for this pod yet")
        elif w.idle_for_s is None:
            keep(w, R.NOT_IDLE_LONG_ENOUGH, "busy")
        elif w.idle_for_s < (timeout_s := policy.idle_timeout_for_s(w.group)):
            keep(w, R.NOT_IDLE_LONG_ENOUGH, f"idle {w.idle_for_s:.0f}s < timeout {timeout_s:.0f}s")
        else:
            candidates.append(w)

    # 3. Pending-PG protection: keep the idle candidates that pending or rescheduling
    # PGs need for their unplaced bundles to fit, after using every node that stays.
    # It reads step 4's headroom to prefer candidates the group minimum keeps anyway.
    pending, headroom = _headroom(cluster, {p.name for p in pods})
    occupants = _occupants(snapshot, going_away)
    staying = {n.node_id for n in snapshot.ray.nodes if n.alive} - {
        ray_by_pod[name].node_id for _, name in going_away if name in ray_by_pod}
    needed = _needed_by_pending_pgs(snapshot, candidates, staying, headroom, occupants, cluster)
    for w in candidates:
        if w.pod.name in needed:
            keep(w, R.NEEDED_BY_PENDING_PG, needed[w.pod.name])
    candidates = [w for w in candidates if w.pod.name not in kept]

    # 4. The group minimum: at most headroom[group] deletions per group; the rest
    #    are kept with GROUP_MINIMUM.
    # 5. Which ones: defragmentation order (frees a whole Kubernetes node first,
    #    then the most idle, then by name), so the minimum keeps the others.
    names = {_key(w.pod) for w in candidates}
    candidates.sort(key=lambda w: _defrag_key(w, names, occupants))
    to_delete: dict[str, list[_Worker]] = defaultdict(list)
    for w in candidates:
        g = cluster.group(w.group)
        if len(to_delete[w.group]) < headroom[w.group]:
            to_delete[w.group].append(w)
        else:
            keep(w, R.GROUP_MINIMUM, f"replicas {g.replicas} - pending deletions {pending[w.group]}"
                 f" - {len(to_delete[w.group])} planned would go below minReplicas {g.min_replicas}")

    # 6. Emit one GroupScaleDown per shrinking group, in spec order; names sorted.
    decisions = dict(kept)
    scale_downs = []
    for index, g in enumerate(cluster.worker_groups):
        chosen = sorted(to_delete.get(g.group_name, []), key=lambda w: w.pod.name)
        if not chosen:
            continue
        for w in chosen:
            timeout_s = policy.idle_timeout_for_s(w.group)
            decisions[w.pod.name] = _decision(w, DecisionAction.DELETE, R.IDLE,
                                              f"idle {w.idle_for_s:.0f}s >= timeout {timeout_s:.0f}s")
        added = tuple(w.pod.name for w in chosen)
        scale_downs.append(GroupScaleDown(
            group_name=g.group_name, group_index=index, old_replicas=g.replicas,
            replicas=max(0, g.replicas - len(added)),
            workers_to_delete=g.workers_to_delete + added, added=added))
    deleted = [w for ws in to_delete.values() for w in ws]
    deleted_keys = {_key(w.pod) for w in deleted}
    freed = sorted({w.pod.node_name for w in deleted if w.pod.node_name
                    and occupants.get(w.pod.node_name, set()) <= deleted_keys})
    return ReclaimPlan(
        cluster=cluster.name, namespace=cluster.namespace,
        cluster_resource_version=cluster.resource_version, planned_at_s=now_s,
        to_delete=tuple(scale_downs),
        decisions=tuple(decisions[n] for n in sorted(decisions)),
        freed_k8s_nodes=tuple(freed),
        reclaimed_gpus=sum(w.node.gpu_total for w in deleted if w.node),
        idle_gpu_s=sum(w.node.gpu_total * (w.idle_for_s or 0.0) for w in deleted if w.node),
    )


def _decision(w: _Worker, action: DecisionAction, reason: ReclaimReason, detail: str) -> Decision:
    return Decision(pod_name=w.pod.name, group=w.group, action=action, reason=reason, detail=detail,
                    k8s_node_name=w.pod.node_name, ray_node_id=w.node.node_id if w.node else None,
                    gpus=w.node.gpu_total if w.node else 0.0, idle_for_s=w.idle_for_s)


def _bundle_holders(pgs: tuple[PlacementGroupView, ...]) -> dict[str, str]:
    """Ray node id -> the first (by id) live placement group with a bundle on it."""
    held: dict[str, str] = {}
    for pg in sorted(pgs, key=lambda p: p.pg_id):
        if pg.state is not PgState.REMOVED:
            for node_id in pg.bundle_node_ids:
                if node_id:
                    held.setdefault(node_id, pg.name or pg.pg_id)
    return held


def _headroom(cluster: RayClusterView, pod_names: set[str]) -> tuple[dict[str, int], dict[str, int]]:
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


def _key(pod: K8sPodView) -> tuple[str, str]:
    return (pod.namespace, pod.name)


def _reservation(w: _Worker) -> str | None:
    """The reservation a worker belongs to: its pod label, else its rg- group."""
    if LABEL_RESERVATION in w.pod.labels:
        return w.pod.labels[LABEL_RESERVATION]
    return w.group if w.group.startswith(RESERVATION_GROUP_PREFIX) else None


def _occupants(snapshot: Snapshot, going_away: set[tuple[str, str]]) -> dict[str, set[tuple[str, str]]]:
    """Kubernetes node name -> (namespace, name) of the pods that will still be on it."""
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for p in snapshot.k8s.pods:
        if p.node_name and not p.deleting and p.phase not in _GONE_PHASES and _key(p) not in going_away:
            out[p.node_name].add(_key(p))
    return out


def _defrag_key(w: _Worker, candidates: set[tuple[str, str]], occupants: dict[str, set[tuple[str, str]]]) -> tuple:
    """Sort key: fewest pods that stay on its node, fewest fellow candidates, most idle, name."""
    if not w.pod.node_name:
        return (1, 0, -(w.idle_for_s or 0.0), w.pod.name)  # unknown node: never "frees" one
    others = occupants.get(w.pod.node_name, set()) - {_key(w.pod)}
    return (len(others - candidates), len(others & candidates), -(w.idle_for_s or 0.0), w.pod.name)


def _needed_by_pending_pgs(snapshot: Snapshot, candidates: list[_Worker], staying: set[str],
                           headroom: dict[str, int], occupants: dict[str, set[tuple[str, str]]],
                           cluster: RayClusterView) -> dict[str, str]:
    """Simulate placing the unplaced bundles of every pending or rescheduling PG.

    Nodes that stay are used first (best fit on GPUs), then candidates, picking
    the one the reclaimer would least like to delete: one its group keeps anyway
    for the minimum, then one that frees no node, then the least idle. A bundle
    that fits nowhere now may wait for a busy node that stays (judged on its
    total resources); failing that it needs a new worker. If no worker group
    can still grow (below ``maxReplicas``) with a template that could host it,
    the PG cannot be placed whatever is kept, and it protects nothing (its
    picks are undone). Every candidate that receives a bundle of a placeable PG is
    returned (pod name -> why).
    """
    nodes = {n.node_id: n for n in snapshot.ray.nodes}
    by_node = {w.node.node_id: w for w in candidates if w.node is not None}
    avail = {nid: dict(nodes[nid].available) for nid in sorted(staying | set(by_node)) if nid in nodes}
    spare = {g: -n for g, n in headroom.items()}  # per group: candidates the minimum keeps anyway
    for w in candidates:
        spare[w.group] += 1
    growth = {g.group_name: max(0, g.max_replicas - g.replicas) for g in cluster.worker_groups}
    names = {_key(w.pod) for w in candidates}
    needed: dict[str, str] = {}  # pod name -> why
    for pg in sorted((p for p in snapshot.ray.placement_groups if p.state in _PENDING), key=lambda p: p.pg_id):
        undo: list[tuple[str, dict[str, float], str | None]] = []  # (node, demand taken, pod newly needed)
        pg_total: dict[str, dict[str, float]] = {}  # node -> what this PG's units took of it, on totals
        unplaced: list[tuple[dict[str, float], list[dict[str, str]]]] = []
        for demand, selectors, allowed, used in _units(pg):
            hosts = [nid for nid in avail if (allowed is None or nid in allowed) and nid not in used
                     and _fits(demand, avail[nid]) and all(_matches(s, nodes[nid].labels) for s in selectors)]
            free = [nid for nid in hosts if nid not in by_node or by_node[nid].pod.name in needed]
            picked = None
            if free:
                nid = min(free, key=lambda n: (avail[n].get("GPU", 0.0), n))
            elif hosts:
                nid = min(hosts, key=lambda n: (spare[by_node[n].group] <= 0,
                                               tuple(-x for x in _defrag_key(by_node[n], names, occupants)[:2]),
                                               by_node[n].idle_for_s or 0.0, n))
                picked = by_node[nid]
                needed[picked.pod.name] = f"placement group {pg.name or pg.pg_id} ({pg.state.value}) needs it to fit"
                spare[picked.group] -= 1
            else:
                # nothing free now: a busy node that stays may free up later (judged on its total), else
                # only a new worker can take it
                later = [n for n in sorted(staying) if n in nodes and (allowed is None or n in allowed)
                         and n not in used and all(_matches(sel, nodes[n].labels) for sel in selectors)
                         and _fits(demand, _minus(nodes[n].total, pg_total.get(n, {})))]
                if later:
                    pg_total[later[0]] = _plus(pg_total.get(later[0], {}), demand)
                    if pg.strategy == "STRICT_SPREAD":
                        used.add(later[0])
                else:
                    unplaced.append((demand, selectors))
                continue
            for k, v in demand.items():
                avail[nid][k] = avail[nid].get(k, 0.0) - v
            pg_total[nid] = _plus(pg_total.get(nid, {}), demand)
            undo.append((nid, demand, picked.pod.name if picked else None))
            if pg.strategy == "STRICT_SPREAD":
                used.add(nid)
        if unplaced and not _growth_fits(unplaced, cluster, growth, pg.strategy):
            for nid, demand, pod in reversed(undo):  # it cannot be placed: keep nothing for it
                for k, v in demand.items():
                    avail[nid][k] += v
                if pod is not None:
                    del needed[pod]
                    spare[by_node[nid].group] += 1
    return needed


def _growth_fits(units: list[tuple[dict[str, float], list[dict[str, str]]]], cluster: RayClusterView,
                 growth: dict[str, int], strategy: str) -> bool:
    """Could new workers (groups below maxReplicas) host ``units``? Optimistic where a template says
    nothing (custom resources, labels it does not set): keeping a worker too long is the safe error.
    Consumes ``growth`` slots when they fit, so later PGs see what is left."""
    opened: list[tuple[str, dict[str, float]]] = []  # new workers of this PG: (group, Ray resources left)
    taken: dict[str, int] = defaultdict(int)
    for demand, selectors in units:
        spot = None
        if strategy not in ("STRICT_SPREAD", "STRICT_PACK"):
            spot = next((o for o in opened if _fits_known(demand, o[1])), None)
        if spot is None:
            g = next((g for g in cluster.worker_groups if growth.get(g.group_name, 0) - taken[g.group_name] > 0
                      and _fits_known(demand, {"GPU": g.ray_gpus, "CPU": g.ray_cpus})
                      and all(_matches({k: v for k, v in s.items() if k in g.ray_labels}, g.ray_labels)
                              for s in selectors)), None)
            if g is None:
                return False
            taken[g.group_name] += 1
            spot = (g.group_name, {"GPU": g.ray_gpus, "CPU": g.ray_cpus})
            opened.append(spot)
        for k in ("GPU", "CPU"):
            if spot[1].get(k, 0.0) > 0:
                spot[1][k] -= demand.get(k, 0.0)
    for name, n in taken.items():
        growth[name] -= n
    return True


def _plus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}


def _minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


def _fits_known(demand: dict[str, float], have: dict[str, float]) -> bool:
    """GPU must fit (a group without GPUs hosts no GPU bundle); CPU must fit when the template says."""
    if demand.get("GPU", 0.0) > have.get("GPU", 0.0) + _EPS:
        return False
    return not (have.get("CPU", 0.0) > 0 and demand.get("CPU", 0.0) > have["CPU"] + _EPS)


def _units(pg: PlacementGroupView) -> list[tuple[dict[str, float], list[dict[str, str]], set[str] | None, set[str]]]:
    """The placement units of a PG's unplaced bundles: (demand, selectors, allowed nodes, excluded nodes).

    STRICT_PACK: one unit, the sum, on the node of a placed bundle if any.
    STRICT_SPREAD: one per bundle, never on a node that holds another of its bundles
    (the excluded set is shared and grows as units are placed). Others: one per bundle.
    Largest GPU demand first.
    """
    placed = {n for n in pg.bundle_node_ids if n}
    unplaced = [i for i in range(len(pg.bundles)) if i >= len(pg.bundle_node_ids) or not pg.bundle_node_ids[i]]
    unplaced.sort(key=lambda i: (-pg.bundles[i].get("GPU", 0.0), -pg.bundles[i].get("CPU", 0.0), i))
    sel = [pg.bundle_label_selectors[i] if i < len(pg.bundle_label_selectors) else {} for i in unplaced]
    if pg.strategy == "STRICT_PACK" and unplaced:
        total: dict[str, float] = defaultdict(float)
        for i in unplaced:
            for k, v in pg.bundles[i].items():
                total[k] += v
        return [(dict(total), sel, placed or None, set())]
    used = placed if pg.strategy == "STRICT_SPREAD" else set()
    return [(pg.bundles[i], [s], None, used) for i, s in zip(unplaced, sel)]


def _fits(demand: dict[str, float], avail: dict[str, float]) -> bool:
    return all(avail.get(k, 0.0) + _EPS >= v for k, v in demand.items() if v > 0)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Ray label-selector semantics: ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``."""
    for key, want in selector.items():
        negate = want.startswith("!")
        expr = want[1:] if negate else want
        have = labels.get(key)
        if expr.startswith("in(") and expr.endswith(")"):
            ok = have in {v.strip() for v in expr[3:-1].split(",")}
        else:
            ok = have == expr
        if ok == negate:
            return False
    return True
