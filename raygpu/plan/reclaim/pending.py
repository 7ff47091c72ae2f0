"""Which idle candidates pending or rescheduling placement groups need, so that they can still be placed.

Step 3 of ``plan.reclaim.plan_reclaim``. Pure, no pydantic objects: it works on
:class:`Host` (a Ray node whose capacity counts) and :class:`Candidate` (an
idle worker the reclaimer could delete) and returns pod name -> why it stays.
Three passes:

1. **Simulation** (all PGs together, by id): each unplaced bundle goes on a
   node that stays (best fit on GPUs), else on the candidate the reclaimer
   least wants to delete, else it may wait for a busy node that stays (judged
   on its total), else it needs a new worker (``growth``). A PG that fits
   nowhere, even with new workers, protects nothing. Free capacity is kept in
   a :class:`~raygpu.plan.common.free_index.FreeIndex` of the nodes that could take
   a unit at all (free resources only shrink in the passes; busy nodes are
   left out after one look at their free GPUs) and each bundle stops at its
   first fit, so the pass grows with nodes + bundles x shapes, not nodes x
   bundles.
2. **Proof** (each PG on its own, on the nodes' free resources now): a PG that
   can be placed now must still be placeable on what stays. The pass looks for
   a placement on the nodes that stay; failing that, for one on all counted
   nodes (``plan.placement.find_placement``, exhaustive up to a step budget)
   and keeps the candidates it uses. If the search proves there is none, the
   PG protects nothing; if it runs out of budget, every candidate that could
   take one of its bundles stays: what cannot be proved safe is not deleted.
   PGs of one shape (``plan.placement.signature``) share one answer.
3. **Together** (``plan.together``, when two or more PGs have unplaced
   bundles): greedily in Ray's order (rescheduling first, then by id), the PGs
   that can be placed together now can still all be placed together on what
   stays.

The searches of passes 2 and 3 share one budget per cycle (``plan.placement.Steps``, ``steps`` placement
steps). When it runs out, nothing more is proved: every candidate that could take a bundle of a pending PG
stays (those are the nodes the index holds), and ``PendingNeeds.budget_spent`` says why.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, lt, not_
from typing import NamedTuple, Protocol

from raygpu.model.views import PgState, PlacementGroupView
from raygpu.plan.common.free_index import CAND, EPS, FREE, FreeIndex, demand_shape, fits, matches_all
from raygpu.plan.reclaim.placement import UNKNOWN, Shapes, Steps, Unit, could_host, find_placement
from raygpu.plan.reclaim.together import prove_together

_PENDING = (PgState.PENDING, PgState.RESCHEDULING)
_AVAILABLE, _PG_ID = attrgetter("available"), attrgetter("pg_id")


class Host(Protocol):
    """A Ray node whose capacity counts: alive, and its pod exists and is not on its way out.

    ``model.views.RayNodeView`` is one: the reclaimer passes its views as they are, no copy per node."""

    node_id: str
    labels: dict[str, str]
    total: dict[str, float]
    available: dict[str, float]


class Candidate(NamedTuple):
    """An idle worker the reclaimer may delete; ``rank`` orders them, least wanted deletion first."""

    node_id: str
    pod_name: str
    group: str
    rank: tuple


@dataclass(frozen=True)
class Growth:
    """A worker group that can still add ``slots`` workers, and what one of them offers Ray."""

    name: str
    slots: int
    gpus: float
    cpus: float
    labels: dict[str, str]


class PendingNeeds(NamedTuple):
    """Pod name -> why it stays, and why the search budget ran out ('' when it did not)."""

    needed: dict[str, str]
    budget_spent: str = ""


def needed_by_pending_pgs(pgs: tuple[PlacementGroupView, ...], hosts: dict[str, Host],
                          candidates: dict[str, Candidate], spare: dict[str, int],
                          growth: list[Growth], *, steps: Steps | None = None) -> PendingNeeds:
    """Every candidate a pending or rescheduling PG needs, by pod name, with why (see the module docstring).

    ``hosts``: every counted node by id (candidates included); ``candidates`` by node id; ``spare``: per
    group, candidates the group minimum keeps anyway (> 0: prefer them); ``growth`` in spec order;
    ``steps``: the searches' budget (default: ``plan.placement.CYCLE_STEPS`` placement steps).
    """
    budget = Steps() if steps is None else steps
    pending = sorted((p for p in pgs if p.state in _PENDING), key=_PG_ID)
    if not candidates or not pending:
        return PendingNeeds({})  # only candidates are ever needed
    spare = dict(spare)
    shapes = Shapes()
    # the PGs of one shape share their units (pass 1 keeps a STRICT_SPREAD PG's exclusions aside, never in them)
    us = [shapes.of(pg)[0] for pg in pending]
    start = _index(hosts, candidates, [u for pg_units in {id(x): x for x in us}.values() for u in pg_units])
    needed, placed = _simulate(pending, us, hosts, start.copy(), candidates, spare,
                               {g.name: g.slots for g in growth}, growth)
    # pass 2's index: the candidates pass 1 needs stay, the others may go (their free resources, and so
    # their bucket's key, unchanged: only the role moves)
    start.set_roles([nid for nid, c in candidates.items() if c.pod_name in needed and nid in start.free], FREE)
    index = _prove([pg for pg in pending if pg.pg_id not in placed], start, candidates, spare, needed, budget,
                   shapes)
    if sum(1 for pg_units in us if pg_units) > 1 and not budget.exhausted:
        prove_together(pending, placed, index.copy(), index, candidates, spare, needed,
                       lambda: map(_AVAILABLE, map(hosts.__getitem__, sorted(hosts))), budget, shapes)
    if budget.exhausted:  # nothing is proved: every candidate that could take a pending bundle stays
        why = f"the planner ran out of search budget ({budget.spent}): it cannot prove the pending placement " \
              f"groups fit without it"
        for nid in sorted(index.free):
            c = candidates.get(nid)
            if c is not None and c.pod_name not in needed:
                needed[c.pod_name] = why
    return PendingNeeds(needed, budget.spent)


def _index(hosts: dict[str, Host], candidates: dict[str, Candidate], shapes: list[Unit]) -> FreeIndex:
    """Every counted node that could take one of the units ``shapes`` (by its free resources and labels now:
    a node's free resources only shrink in the passes, so no other node is ever picked, searched or kept),
    on its free resources now: role ``free`` if it stays, ``cand`` if it may go.

    Nodes of one (labels, free resources) shape are judged once; a node with fewer free GPUs than every
    unit asks is left out unread (at 20,000 Ray nodes most are busy)."""
    gpu_floor = min((u.demand.get("GPU", 0.0) for u in shapes), default=0.0) - EPS
    judged: dict[tuple, tuple | None] = {}  # (labels, free) items as they come -> both sorted, None: takes no unit
    rows = []  # FreeIndex.build's rows, made as each node is read
    get = candidates.get
    items = hosts.items()
    if gpu_floor > 0:  # in C: most nodes are busy, and one look at their free GPUs leaves them out
        frees = map(_AVAILABLE, hosts.values())
        items = compress(items, map(not_, map(lt, map(dict.get, frees, repeat("GPU"), repeat(0.0)), repeat(gpu_floor))))
    for nid, h in items:
        labels, free = h.labels, h.available
        raw = (tuple(labels.items()), tuple(free.items()))
        keys = judged.get(raw, judged)
        if keys is judged:
            keys = judged[raw] = (tuple(sorted(raw[0])), tuple(sorted(raw[1]))) if any(
                fits(u.demand, free) and matches_all(u.selectors, labels) for u in shapes) else None
        if keys is not None:
            c = get(nid)
            rows.append((nid, labels, free, FREE, "", (), keys) if c is None
                        else (nid, labels, free, CAND, c.group, c.rank, keys))
    rows.sort()  # node ids are unique: the sort never compares further
    return FreeIndex.build(rows)


def _why(pg: PlacementGroupView, tail: str = "") -> str:
    return f"placement group {pg.name or pg.pg_id} ({pg.state.value}) needs it to fit{tail}"


def _simulate(pending, units_of, hosts, index, candidates, spare, slots,
              growth) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Pass 1 on ``index`` (every counted node that could take a unit, candidates in role ``cand``; changed):
    (pod name -> why, id -> the node of each unit for the PGs it placed entirely on nodes that now stay,
    placed one after the other in id order). ``units_of``: the units of each PG, one list shared by the PGs
    of one shape and not changed (a STRICT_SPREAD PG's exclusions grow in a set of its own).

    A backlog makes memos worth it: a demand nothing takes now stays so while the index only shrinks, and
    so does a PG of which every unit waits for a busy node (the same answers, on totals that never change):
    the next PG of its shape would do exactly that again, so it is passed over."""
    later = _LaterIndex(hosts)
    needed: dict[str, str] = {}
    placed: dict[str, list[str]] = {}
    # (demand, selectors) no node takes now, whatever a unit's exclusions, and the units lists of PGs whose
    # every unit waited (both cleared when a PG gives its nodes back); the key of each unit, by its id
    nothing_now: set[tuple] = set()
    waits_only: set[int] = set()
    key_of: dict[int, tuple] = {}
    for pg, us in zip(pending, units_of):
        if id(us) in waits_only:
            continue  # as the PG of its shape before it: every unit waits, nothing changes
        # a STRICT_SPREAD PG's units never share a node: the nodes its units took or wait for join its own
        # exclusions (its units share one set, the nodes of its placed bundles)
        spread_excl = set(us[0].excluded) if us and pg.strategy == "STRICT_SPREAD" else None
        undo: list[tuple[str, dict[str, float], str | None]] = []  # (node, demand taken, pod newly needed)
        # node -> what this PG's units took of it, on totals: made from ``undo`` when a unit first waits
        pg_total: dict[str, dict[str, float]] | None = None
        why = None  # this PG's reason, for the candidates it needs
        unplaced: list[tuple[dict[str, float], list[dict[str, str]]]] = []
        for u in us:
            excl = u.excluded if spread_excl is None else spread_excl
            key = key_of.get(id(u))
            if key is None:
                key = key_of[id(u)] = demand_shape(u.demand, u.selectors)
            nid, picked = (None, False) if key in nothing_now else _pick(index, u, key, excl, spare)
            if nid is None:
                if u.allowed is None and not excl:
                    nothing_now.add(key)
                # nothing free now: a busy node that stays may free up later (judged on its total), else
                # only a new worker can take it
                if pg_total is None:
                    pg_total = {}
                    for nid, demand, _ in undo:
                        pg_total[nid] = _plus(pg_total.get(nid, {}), demand)
                wait = later.first(u, excl, pg_total)
                if wait is not None:
                    pg_total[wait] = _plus(pg_total.get(wait, {}), u.demand)
                    if spread_excl is not None:
                        spread_excl.add(wait)
                else:
                    unplaced.append((u.demand, u.selectors))
                continue
            pod = None
            if picked:
                pod = candidates[nid].pod_name
                needed[pod] = why = why or _why(pg)
                spare[candidates[nid].group] -= 1
            index.less(nid, u.demand, FREE)
            if pg_total is not None:
                pg_total[nid] = _plus(pg_total.get(nid, {}), u.demand)
            undo.append((nid, u.demand, pod))
            if spread_excl is not None:
                spread_excl.add(nid)
        if unplaced and not _growth_fits(unplaced, growth, slots, pg.strategy):
            nothing_now.clear()  # what it gives back may take a unit that found nothing
            waits_only.clear()
            for nid, demand, pod in reversed(undo):  # it cannot be placed: keep nothing for it
                free = index.free[nid]
                role = CAND if pod is not None else index.role[nid]
                index.move(nid, {k: v + demand.get(k, 0.0) for k, v in free.items()}, role)
                if pod is not None:
                    del needed[pod]
                    spare[candidates[nid].group] += 1
        elif len(undo) == len(us):
            placed[pg.pg_id] = [nid for nid, _, _ in undo]  # a placement now, on free resources less earlier PGs'
        elif not undo and not unplaced:
            waits_only.add(id(us))
    return needed, placed


def _pick(index: FreeIndex, u: Unit, shape: tuple, excluded: set[str], spare: dict[str, int]
          ) -> tuple[str | None, bool]:
    """(node, is a candidate newly needed): a node that stays first (least free GPU, then id), else the
    candidate the reclaimer least wants to delete; (None, False) when nothing takes the unit now.
    ``shape``: ``demand_shape`` of the unit; ``excluded``: the nodes it must not use (``u.excluded``, or its
    STRICT_SPREAD PG's so far)."""
    if u.allowed is not None:  # STRICT_PACK with placed bundles: only their nodes, a handful
        hosts = [n for n in sorted(u.allowed) if n in index.free and n not in excluded
                 and fits(u.demand, index.free[n]) and matches_all(u.selectors, index.labels[n])]
        free = [n for n in hosts if index.role[n] == FREE]
        if free:
            return min(free, key=lambda n: (index.free[n].get("GPU", 0.0), n)), False
        if hosts:
            return min(hosts, key=lambda n: (spare[index.group[n]] <= 0, index.rank[n])), True
        return None, False
    return index.pick(u.demand, u.selectors, excluded, spare, shape)


class _LaterIndex:
    """Counted nodes by (labels, total), ids sorted: the first that could take a unit once its work ends.

    The answer is the lowest node id that qualifies, so the nodes are grouped in id order only as far as a
    question needs: once a group of the nodes grouped so far has a node that qualifies, no node beyond them
    can have a lower id. A backlog's questions are answered among the first few nodes; a question nothing
    answers groups them all, once (what grouping every node when first asked cost). Nodes are grouped by the
    items as they come: two groups of one shape give the same answer as one (the lower of their firsts).
    Totals do not change, so an answer is kept for every later question alike (a backlog asks the same
    thousands of times)."""

    _FIRST_CHUNK = 64  # nodes grouped at the first question; each chunk after doubles what is grouped

    def __init__(self, hosts: dict[str, Host]) -> None:
        self._hosts = hosts
        self._order: list[str] | None = None  # every node id, sorted (when first asked)
        self._grouped = 0  # how many of ``_order`` are in ``_groups``
        # (labels items, total items) -> (labels, total, the ids of the nodes grouped so far, in id order)
        self._groups: dict[tuple, tuple[dict[str, str], dict[str, float], list[str]]] = {}
        self._answers: dict[tuple, str | None] = {}

    def _group_more(self) -> bool:
        """Group the next chunk of nodes in id order; False when every node is grouped already."""
        if self._order is None:
            self._order = sorted(self._hosts)
        done = self._grouped
        if done >= len(self._order):
            return False
        upto = min(len(self._order), max(self._FIRST_CHUNK, 2 * done))
        hosts, groups = self._hosts, self._groups
        for nid in self._order[done:upto]:
            h = hosts[nid]
            labels, total = h.labels, h.total
            key = (tuple(labels.items()), tuple(total.items()))
            group = groups.get(key)
            if group is None:
                groups[key] = (labels, total, [nid])
            else:
                group[2].append(nid)
        self._grouped = upto
        return True

    def first(self, u: Unit, excluded: set[str], pg_total: dict[str, dict[str, float]]) -> str | None:
        """The first node that could take ``u`` once its work ends, not in ``excluded``, less what its PG
        took there (``pg_total``)."""
        # by the unit object (its demand, selectors and allowed nodes never change; it lives through the
        # cycle, shared by the PGs of its shape), the exclusions now, and what its PG took where
        key = (id(u), tuple(sorted(excluded)) if excluded else (),
               tuple(sorted((n, tuple(sorted(d.items()))) for n, d in pg_total.items())) if pg_total else ())
        if key not in self._answers:
            self._answers[key] = self._first(u, excluded, pg_total)
        return self._answers[key]

    def _first(self, u: Unit, excluded: set[str], pg_total: dict[str, dict[str, float]]) -> str | None:
        def ok(nid: str) -> bool:
            h = self._hosts[nid]
            left = {k: v - pg_total.get(nid, {}).get(k, 0.0) for k, v in h.total.items()}
            return nid not in excluded and matches_all(u.selectors, h.labels) and fits(u.demand, left)

        if u.allowed is not None:
            return next((n for n in sorted(u.allowed) if n in self._hosts and ok(n)), None)
        mine = next((n for n in sorted(pg_total) if ok(n)), None)  # nodes this PG already uses: one by one
        while True:
            best = None
            for labels, total, ids in self._groups.values():
                if fits(u.demand, total) and matches_all(u.selectors, labels):
                    n = next((n for n in ids if n not in excluded and n not in pg_total), None)
                    if n is not None and (best is None or n < best):
                        best = n
            if best is not None or not self._group_more():
                break
        return best if mine is None or (best is not None and best < mine) else mine


def _prove(pending, index: FreeIndex, candidates, spare, needed: dict[str, str], budget: Steps,
           shapes: Shapes) -> FreeIndex:
    """Pass 2 on ``index`` (every counted node on its free resources now, role ``free`` if it stays; changed):
    make every PG that can be placed now placeable on what stays (adds to ``needed``); returns ``index``.

    PGs of one signature share the answer: a placement on what stays stays one (the pass only turns
    candidates into nodes that stay), and no placement on all counted nodes stays none (their free resources
    do not change)."""
    settled: set[tuple] = set()  # signatures placeable on what stays, or on nothing
    for pg in pending:
        if budget.exhausted:
            break
        us, sig = shapes.of(pg)
        if not us or sig in settled:
            continue
        if find_placement(us, index, spare, candidates_too=False, steps=budget) not in (None, UNKNOWN):
            settled.add(sig)
            continue
        found = find_placement(us, index, spare, candidates_too=True, steps=budget)
        if found is None:
            settled.add(sig)
            continue  # proved: it cannot be placed now, with or without the candidates
        if found is UNKNOWN:
            keep = could_host(index, us)
            tail = " (the planner cannot prove it fits without it)"
        else:
            keep = {n for n in found if index.role[n] == CAND}
            tail = " now"
        settled.add(sig)  # what it could use now stays
        for nid in sorted(keep):
            needed[candidates[nid].pod_name] = _why(pg, tail)
            spare[candidates[nid].group] -= 1
            index.set_role(nid, FREE)
    return index


def _growth_fits(units_left: list[tuple[dict[str, float], list[dict[str, str]]]], growth: list[Growth],
                 slots: dict[str, int], strategy: str) -> bool:
    """Could new workers (groups below maxReplicas) host ``units_left``? Optimistic where a template says
    nothing (custom resources, labels it does not set): keeping a worker too long is the safe error.
    Consumes ``slots`` when they fit, so later PGs see what is left."""
    opened: list[tuple[str, dict[str, float]]] = []  # new workers of this PG: (group, Ray resources left)
    taken: dict[str, int] = defaultdict(int)
    for demand, selectors in units_left:
        spot = None
        if strategy not in ("STRICT_SPREAD", "STRICT_PACK"):
            spot = next((o for o in opened if _fits_known(demand, o[1])), None)
        if spot is None:
            g = next((g for g in growth if slots.get(g.name, 0) - taken[g.name] > 0
                      and _fits_known(demand, {"GPU": g.gpus, "CPU": g.cpus})
                      and matches_all([{k: v for k, v in s.items() if k in g.labels} for s in selectors], g.labels)),
                     None)
            if g is None:
                return False
            taken[g.name] += 1
            spot = (g.name, {"GPU": g.gpus, "CPU": g.cpus})
            opened.append(spot)
        for k in ("GPU", "CPU"):
            if spot[1].get(k, 0.0) > 0:
                spot[1][k] -= demand.get(k, 0.0)
    for name, n in taken.items():
        slots[name] -= n
    return True


def _fits_known(demand: dict[str, float], have: dict[str, float]) -> bool:
    """GPU must fit (a group without GPUs hosts no GPU bundle); CPU must fit when the template says."""
    if demand.get("GPU", 0.0) > have.get("GPU", 0.0) + EPS:
        return False
    return not (have.get("CPU", 0.0) > 0 and demand.get("CPU", 0.0) > have["CPU"] + EPS)


def _plus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}
