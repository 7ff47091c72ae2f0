"""Pass 3 of the pending-PG protection (``plan.pending``): PGs that fit together now still fit together after.

Ray's GCS places pending placement groups one at a time, in the order of its pending queue: a rescheduling
PG first (rank 0), then the others by when they were queued (their creation, then each failed try's retry
time). The view carries no creation time, so the planner takes the rescheduling PGs first and then the
others by id. Greedily in that order, a PG joins ``taken`` when ``taken`` and it can all be placed together
on the counted nodes' free resources now, however the earlier ones are placed; the pass keeps the
candidates that one such placement of all of ``taken`` uses, so that it still exists after the plan.

Linear in the common case: each PG is searched (``plan.placement.find_placement``) on what the PGs before
it left, their placements fixed (the simulation's placement, when it placed the PG and it still fits, is
reused). Only a PG that fits on its own but not on what the others left is searched together with every PG
of ``taken`` (after the room tests below, which settle most such cases): found, that joint placement
replaces the fixed ones; proved impossible, the PG stays out of ``taken``. When a search runs out of
budget, nothing is proved, and every candidate that could host a bundle of any pending PG that can be
placed on its own stays: what cannot be proved safe is not deleted.

Linear at a backlog too (pending PGs beyond the idle room): before a joint search, room tests kept up to
date as PGs join (``_Asked``: the resources summed, then per demand Hall's condition on the nodes each label
selector admits, counting how many such units each node's free resources hold) prove most of them impossible
without a search or a walk over ``taken``, and answers are shared by the PGs of one signature
(``plan.placement.signature``): no placement on what ``taken`` left stays none while ``taken`` only grows; a
PG that cannot be placed together with ``taken`` never can, since ``taken`` only grows; a PG's placement on
its own is a fact of the free resources now. Every search charges the cycle's step budget
(``plan.placement.Steps``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import reduce
from itertools import chain, repeat
from operator import add, attrgetter
from typing import Callable, Iterable

from raygpu.model.views import PgState, PlacementGroupView
from raygpu.plan.common.free_index import CAND, EPS, FREE, FreeIndex, fits
from raygpu.plan.reclaim.placement import UNKNOWN, Shapes, Steps, Unit, could_host, find_placement

_PG_ID = attrgetter("pg_id")
_Taken = tuple[PlacementGroupView, list[Unit], list[str]]  # a PG of ``taken``, its units, the node of each


def prove_together(pending: list[PlacementGroupView], placed: dict[str, list[str]], cur: FreeIndex,
                   base: FreeIndex, candidates: dict, spare: dict[str, int], needed: dict[str, str],
                   supply_of: Callable[[], Iterable[dict[str, float]]], steps: Steps, shapes: Shapes) -> None:
    """Keep (add to ``needed``: pod name -> why) the candidates that the PGs fitting together need.

    ``pending``: the pending and rescheduling PGs; ``placed``: id -> node per unit of the PGs the simulation
    placed on nodes that stay; ``cur`` and ``base``: two fresh indexes of every counted node on its free
    resources (roles: stays or candidate); ``cur`` gets the placements of ``taken`` subtracted; ``candidates``
    (node id -> ``plan.pending.Candidate``) and ``spare`` as for ``plan.pending.needed_by_pending_pgs``;
    ``supply_of()``: the free resources of every counted node (the indexes hold only those that could take
    a unit), summed for a quick "not enough for all of them" test; ``steps``: the cycle's search budget (the
    pass stops when it runs out, and the caller keeps what it could not judge); ``shapes``: each PG's units and
    signature (``plan.placement.Shapes``, shared with pass 2).
    """
    by_id = sorted(pending, key=_PG_ID)  # (rescheduling first, id), as two stable passes: no key tuple per PG
    rescheduling = [pg for pg in by_id if pg.state is PgState.RESCHEDULING]
    order = rescheduling + [pg for pg in by_id if pg.state is not PgState.RESCHEDULING] if rescheduling else by_id
    taken: list[_Taken] = []
    # answers shared by the PGs of one signature (see the module docstring)
    left_none: set[tuple] = set()  # no placement on ``cur`` (until a joint placement rearranges ``taken``)
    alone_of: dict[tuple, list[str] | None | str] = {}  # placement on ``base`` on its own
    apart: set[tuple] = set()  # no placement together with ``taken``

    def keep(nodes, pgs: list[PlacementGroupView], tail: str) -> None:
        why = None  # ``_why(pgs, tail)``, written only when a candidate is kept (most PGs keep none here)
        for nid in sorted(set(nodes)):
            if base.role[nid] == CAND:
                c = candidates[nid]
                needed[c.pod_name] = why = why or _why(pgs, tail)
                spare[c.group] -= 1
                cur.set_role(nid, FREE)
                base.set_role(nid, FREE)

    asked = _Asked(base, supply_of)  # what ``taken`` asks, for the room tests
    for pg in order:
        if steps.exhausted:
            return None
        us, sig = shapes.of(pg)
        if not us:
            continue
        nodes = placed.get(pg.pg_id)
        if nodes is None or not _fits_on(cur, us, nodes):
            nodes = None
            if sig not in left_none:
                nodes = find_placement(us, cur, spare, candidates_too=False, steps=steps)
                if not isinstance(nodes, list):
                    nodes = find_placement(us, cur, spare, candidates_too=True, steps=steps)
                if nodes is None:
                    left_none.add(sig)
        if nodes is UNKNOWN:
            return _keep_all(order, base, spare, keep, steps, shapes)
        if nodes is not None:
            keep(nodes, [pg], " beside the placement groups before it" if taken else "")
            _commit(cur, us, nodes, 1.0)
            taken.append((pg, us, nodes))
            asked.add(us)
            continue
        if sig in apart:
            continue  # proved for an earlier PG of its signature, and ``taken`` only grew since
        alone = alone_of.get(sig, alone_of)
        if alone is alone_of:
            alone = alone_of[sig] = find_placement(us, base, spare, candidates_too=True, steps=steps)
        if alone is UNKNOWN:
            return _keep_all(order, base, spare, keep, steps, shapes)
        if alone is None:
            continue  # proved: it cannot be placed now even on its own
        if not asked.room_with(us):
            apart.add(sig)
            continue  # proved: not enough room for all of them
        group = taken + [(pg, us, [])]
        joint = [Unit(u.demand, u.selectors, u.allowed, u.excluded, u.spread, owner)
                 for owner, (_, tus, _) in enumerate(group) for u in tus]
        found = find_placement(joint, base, spare, candidates_too=False, steps=steps)
        if not isinstance(found, list):
            found = find_placement(joint, base, spare, candidates_too=True, steps=steps)
        if found is UNKNOWN:
            return _keep_all(order, base, spare, keep, steps, shapes)
        if found is None:
            apart.add(sig)
            continue  # proved: it cannot be placed together with the PGs before it
        left_none.clear()  # ``taken`` is placed anew: what it leaves is not a subset of what it left
        asked.add(us)
        keep(found, [g[0] for g in group], " together")
        for _, tus, tnodes in taken:
            _commit(cur, tus, tnodes, -1.0)
        taken, at = [], 0
        for gpg, tus, _ in group:
            taken.append((gpg, tus, found[at:at + len(tus)]))
            _commit(cur, tus, taken[-1][2], 1.0)
            at += len(tus)
    return None


def _keep_all(order: list[PlacementGroupView], base: FreeIndex, spare: dict[str, int], keep, steps: Steps,
              shapes: Shapes) -> None:
    """A search ran out of budget: keep every candidate that could host a unit of a PG that fits on its own
    (or that the planner cannot prove does not), each with the first such PG in ``order`` as its why.

    Linear: a signature is judged once (a second PG of one finds nothing new), and a bucket's candidates are
    read once (the first PG whose unit it takes keeps them all)."""
    seen: set[tuple] = set()
    read: set[tuple] = set()  # keys of the buckets whose candidates are kept
    for pg in order:
        us, sig = shapes.of(pg)
        if not us or sig in seen:
            continue
        seen.add(sig)
        if find_placement(us, base, spare, candidates_too=True, steps=steps) is None:
            continue
        nodes: set[str] = set()
        for u in us:
            if u.allowed is not None:  # only its own nodes, a handful
                nodes |= could_host(base, [u])
                continue
            for b in base.buckets(u.demand, u.selectors):
                if b.key not in read:
                    read.add(b.key)
                    nodes.update(base.cands(b))
        keep(nodes, [pg], " with the others (the planner cannot prove they fit together without it)")


def _why(pgs: list[PlacementGroupView], tail: str) -> str:
    """Names the first ``_NAMED`` PGs and counts the rest (a backlog's set runs to thousands)."""
    names = ", ".join(pg.name or pg.pg_id for pg in pgs[:_NAMED])
    if len(pgs) > _NAMED:
        names += f" and {len(pgs) - _NAMED:,} more"
    return f"placement group{'s' if len(pgs) > 1 else ''} {names} need{'' if len(pgs) > 1 else 's'} it to fit{tail}"


def _fits_on(index: FreeIndex, us: list[Unit], nodes: list[str]) -> bool:
    """Do ``us`` still fit on ``nodes`` (one per unit) on the index's free resources?"""
    if len(set(nodes)) == len(nodes):  # a node per unit (the usual placement): nothing left over to carry
        free = index.free
        for u, n in zip(us, nodes):
            have = free.get(n)
            if have is None or not fits(u.demand, have):
                return False
        return len(nodes) == len(us)
    left: dict[str, dict[str, float]] = {}
    for u, n in zip(us, nodes):
        have = left.get(n, index.free.get(n))
        if have is None or not fits(u.demand, have):
            return False
        left[n] = {k: have.get(k, 0.0) - u.demand.get(k, 0.0) for k in set(have) | set(u.demand)}
    return len(nodes) == len(us)


class _Asked:
    """What the PGs of ``taken`` ask, kept up to date as PGs join, so that the room tests before a joint search
    cost the new PG's bundles and the index's buckets, never a walk over ``taken``.

    ``room_with(us)``: a necessary condition for ``taken`` and ``us`` to fit together on ``base`` (False
    proves they cannot). The resources asked, summed, must not exceed every counted node's free resources
    summed (``supply_of``, read once); and per demand, every set of its label-selector classes must ask at
    most as many units as the nodes one of them admits can hold, counting per node how many units of that
    demand its free resources hold (Hall's condition). ``taken`` fits, so only the sets with a class of
    ``us`` can fail: with up to ``_HALL_CLASSES`` classes a demand tests them all, beyond that each class of
    ``us`` on its own and all classes together.
    """

    def __init__(self, base: FreeIndex, supply_of: Callable[[], Iterable[dict[str, float]]]) -> None:
        self._base, self._supply_of = base, supply_of
        self._free: list[dict[str, float]] | None = None  # every counted node's free resources (``supply_of``)
        self._supply: dict[str, float] = {}  # resource -> ``_free`` summed, worked out when first asked
        self._sum: dict[str, float] = defaultdict(float)
        # per demand (items sorted): selector class -> units asked; all classes' buckets; units asked in all
        self._count: dict[tuple, dict[tuple, int]] = defaultdict(dict)  # demand -> selector class -> units
        self._admits: dict[tuple, frozenset[tuple]] = {}  # (demand, class) -> keys of the buckets it admits
        # (demand, bucket key) -> how many units of the demand the bucket's nodes hold. Read when first asked
        # and kept: a bucket of ``base`` is a shape (labels, free resources) and the nodes of a shape stay (the
        # pass moves roles, and a search puts back what it moves), though a bucket object may be replaced.
        self._holds: dict[tuple, int] = {}
        self._joined: dict[int, tuple[list[Unit], int]] = {}  # id of a units list -> it, PGs joined with it
        self._total: dict[tuple, int] = defaultdict(int)  # demand -> units asked, every class
        self._union: dict[tuple, frozenset[tuple]] = defaultdict(frozenset)  # demand -> buckets any class admits

    def add(self, us: list[Unit]) -> None:
        """``us`` joins ``taken``: counted when the next test needs it, once per list (PGs of one shape share
        theirs: ``plan.placement.Shapes``), times the PGs that joined with it."""
        got = self._joined.get(id(us))
        self._joined[id(us)] = (us, 1 if got is None else got[1] + 1)

    def _fold(self) -> None:
        for us, times in self._joined.values():
            for u in us:
                for k, v in u.demand.items():
                    self._sum[k] += max(v, 0.0) * times
                d, cls = _keys(u)
                self._admitted(u, d, cls)
                self._count[d][cls] = self._count[d].get(cls, 0) + times
                self._total[d] += times
                self._union[d] |= self._admits[(d, cls)]
        self._joined.clear()

    def room_with(self, us: list[Unit]) -> bool:
        self._fold()
        # Both tests must hold, so their order changes no answer. Hall's goes first when every bundle of ``us``
        # is of a (demand, class) counted already (a backlog's PGs are of the shapes of ``taken``): then it only
        # reads counts, and when it fails the supply of every counted node is never summed. Otherwise the
        # supply first, as it fails before ``_admitted`` reads a new demand's buckets.
        known = all(_keys(u) in self._admits for u in us)
        if known and not self._hall(us):
            return False
        extra = _sum(u.demand for u in us)
        if any(self._sum.get(k, 0.0) + v > self._supplied(k) + EPS for k, v in extra.items()):
            return False
        return known or self._hall(us)

    def _hall(self, us: list[Unit]) -> bool:
        """Hall's condition per demand for ``taken`` and ``us`` (see the class docstring)."""
        mine: dict[tuple, dict[tuple, int]] = defaultdict(dict)
        for u in us:
            d, cls = _keys(u)
            mine[d][cls] = mine[d].get(cls, 0) + 1
            self._admitted(u, d, cls)
        for d, new in mine.items():
            if not _asks(d):
                continue  # takes nothing: fits anywhere it matches
            have = self._count.get(d, {})
            if len(have) + sum(1 for c in new if c not in have) <= _HALL_CLASSES:
                counts = {c: have.get(c, 0) + new.get(c, 0) for c in {**have, **new}}
                classes = list(counts)
                subsets = [[c for i, c in enumerate(classes) if mask >> i & 1] for mask in range(1, 2 ** len(classes))]
                tests = [(sum(counts[c] for c in sub), frozenset().union(*(self._admits[(d, c)] for c in sub)))
                         for sub in subsets if any(c in new for c in sub)]
            else:  # each class of ``us`` on its own, and all classes together (kept up to date: no walk)
                tests = [(have.get(c, 0) + n, self._admits[(d, c)]) for c, n in new.items()]
                tests.append((self._total[d] + sum(new.values()),
                              self._union[d].union(*(self._admits[(d, c)] for c in new))))
            for want, keys in tests:
                if want > sum(self._holds[(d, key)] for key in keys):
                    return False
        return True

    def _supplied(self, resource: str) -> float:
        """The counted nodes' free ``resource`` summed (``_sum_of``): only the resources the PGs ask are summed."""
        got = self._supply.get(resource)
        if got is None:
            if self._free is None:
                self._free = list(self._supply_of())
            got = self._supply[resource] = _sum_of(self._free, resource)
        return got

    def _admitted(self, u: Unit, d: tuple, cls: tuple) -> None:
        if (d, cls) in self._admits:
            return
        asks, keys = _asks(d), []
        for b in self._base.buckets(u.demand, u.selectors):
            keys.append(b.key)
            if (d, b.key) not in self._holds:
                self._holds[(d, b.key)] = b.live * _holds(asks, b.free) if asks else 0
        self._admits[(d, cls)] = frozenset(keys)


_HALL_CLASSES = 6
_NAMED = 5  # PGs named in a keep's detail


def _keys(u: Unit) -> tuple[tuple, tuple]:
    """A unit's demand and its label-selector class, as hashable keys."""
    return tuple(sorted(u.demand.items())), tuple(tuple(sorted(s.items())) for s in u.selectors)


def _asks(d: tuple) -> dict[str, float]:
    return {k: v for k, v in d if v > EPS}


def _holds(asks: dict[str, float], free: dict[str, float]) -> int:
    """How many units asking ``asks`` (each positive) fit in ``free``."""
    return max(0, min(math.floor((free.get(k, 0.0) + EPS) / v) for k, v in asks.items()))


def _commit(index: FreeIndex, us: list[Unit], nodes: list[str], sign: float) -> None:
    """Take (``sign`` 1) or give back (-1) the units' demand on their nodes."""
    for u, n in zip(us, nodes):
        if sign > 0:
            index.less(n, u.demand)
            continue
        free = index.free[n]
        index.move(n, {k: free.get(k, 0.0) + u.demand.get(k, 0.0) for k in set(free) | set(u.demand)},
                   index.role[n])


def _sum(resources: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per resource, its amounts (each at least 0) added one by one in the order given, from 0.0 (another order
    could differ in the last bit), each resource in one loop in C (``supply_of`` gives every counted node)."""
    rs = list(resources)
    return {k: _sum_of(rs, k) for k in dict.fromkeys(chain.from_iterable(rs))}


def _sum_of(resources: list[dict[str, float]], key: str) -> float:
    """``_sum(resources)[key]`` (0.0 where no map has ``key``), without reading the other resources."""
    return reduce(add, map(max, map(dict.get, resources, repeat(key), repeat(0.0)), repeat(0.0)), 0.0)
