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
of ``taken`` (after a resource-sum test, which settles most such cases): found, that joint placement
replaces the fixed ones; proved impossible, the PG stays out of ``taken``. When a search runs out of
budget, nothing is proved, and every candidate that could host a bundle of any pending PG that can be
placed on its own stays: what cannot be proved safe is not deleted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from raygpu.model.views import PgState, PlacementGroupView
from raygpu.plan.common.free_index import CAND, EPS, FREE, FreeIndex, fits
from raygpu.plan.reclaim.placement import UNKNOWN, Unit, could_host, find_placement, units

_Taken = tuple[PlacementGroupView, list[Unit], list[str]]  # a PG of ``taken``, its units, the node of each


def prove_together(pending: list[PlacementGroupView], placed: dict[str, list[str]], cur: FreeIndex,
                   base: FreeIndex, candidates: dict, spare: dict[str, int], needed: dict[str, str],
                   supply_of: Callable[[], Iterable[dict[str, float]]]) -> None:
    """Keep (add to ``needed``: pod name -> why) the candidates that the PGs fitting together need.

    ``pending``: the pending and rescheduling PGs; ``placed``: id -> node per unit of the PGs the simulation
    placed on nodes that stay; ``cur`` and ``base``: two fresh indexes of every counted node on its free
    resources (roles: stays or candidate); ``cur`` gets the placements of ``taken`` subtracted; ``candidates``
    (node id -> ``plan.pending.Candidate``) and ``spare`` as for ``plan.pending.needed_by_pending_pgs``;
    ``supply_of()``: the free resources of every counted node (the indexes hold only those that could take
    a unit), summed for a quick "not enough for all of them" test.
    """
    order = sorted(pending, key=lambda pg: (pg.state is not PgState.RESCHEDULING, pg.pg_id))
    taken: list[_Taken] = []

    def keep(nodes, why: str) -> None:
        for nid in sorted(set(nodes)):
            if base.role[nid] == CAND:
                c = candidates[nid]
                needed[c.pod_name] = why
                spare[c.group] -= 1
                cur.move(nid, cur.free[nid], FREE)
                base.move(nid, base.free[nid], FREE)

    supply: dict[str, float] = {}  # every counted node's free resources, summed when first needed
    for pg in order:
        us = units(pg)
        if not us:
            continue
        nodes = placed.get(pg.pg_id)
        if nodes is None or not _fits_on(cur, us, nodes):
            nodes = find_placement(us, cur, spare, candidates_too=False)
            if not isinstance(nodes, list):
                nodes = find_placement(us, cur, spare, candidates_too=True)
        if nodes is UNKNOWN:
            return _keep_all(order, base, spare, keep)
        if nodes is not None:
            keep(nodes, _why([pg], " beside the placement groups before it" if taken else ""))
            _commit(cur, us, nodes, 1.0)
            taken.append((pg, us, nodes))
            continue
        alone = find_placement(us, base, spare, candidates_too=True)
        if alone is UNKNOWN:
            return _keep_all(order, base, spare, keep)
        if alone is None:
            continue  # proved: it cannot be placed now even on its own
        group = taken + [(pg, us, [])]
        joint = [Unit(u.demand, u.selectors, u.allowed, u.excluded, u.spread, owner)
                 for owner, (_, tus, _) in enumerate(group) for u in tus]
        supply = supply or _sum(supply_of())
        if any(v > supply.get(k, 0.0) + EPS for k, v in _sum(u.demand for u in joint).items()):
            continue  # proved: not enough resources for all of them
        found = find_placement(joint, base, spare, candidates_too=False)
        if not isinstance(found, list):
            found = find_placement(joint, base, spare, candidates_too=True)
        if found is UNKNOWN:
            return _keep_all(order, base, spare, keep)
        if found is None:
            continue  # proved: it cannot be placed together with the PGs before it
        keep(found, _why([g[0] for g in group], " together"))
        for _, tus, tnodes in taken:
            _commit(cur, tus, tnodes, -1.0)
        taken, at = [], 0
        for gpg, tus, _ in group:
            taken.append((gpg, tus, found[at:at + len(tus)]))
            _commit(cur, tus, taken[-1][2], 1.0)
            at += len(tus)
    return None


def _keep_all(order: list[PlacementGroupView], base: FreeIndex, spare: dict[str, int], keep) -> None:
    """A search ran out of budget: keep every candidate that could host a unit of a PG that fits on its own."""
    for pg in order:
        us = units(pg)
        if us and find_placement(us, base, spare, candidates_too=True) is not None:
            keep(could_host(base, us), _why([pg], " with the others (the planner cannot prove they fit"
                                                  " together without it)"))


def _why(pgs: list[PlacementGroupView], tail: str) -> str:
    names = ", ".join(pg.name or pg.pg_id for pg in pgs)
    return f"placement group{'s' if len(pgs) > 1 else ''} {names} need{'' if len(pgs) > 1 else 's'} it to fit{tail}"


def _fits_on(index: FreeIndex, us: list[Unit], nodes: list[str]) -> bool:
    """Do ``us`` still fit on ``nodes`` (one per unit) on the index's free resources?"""
    left: dict[str, dict[str, float]] = {}
    for u, n in zip(us, nodes):
        have = left.get(n, index.free.get(n))
        if have is None or not fits(u.demand, have):
            return False
        left[n] = {k: have.get(k, 0.0) - u.demand.get(k, 0.0) for k in set(have) | set(u.demand)}
    return len(nodes) == len(us)


def _commit(index: FreeIndex, us: list[Unit], nodes: list[str], sign: float) -> None:
    """Take (``sign`` 1) or give back (-1) the units' demand on their nodes."""
    for u, n in zip(us, nodes):
        free = index.free[n]
        index.move(n, {k: free.get(k, 0.0) - sign * u.demand.get(k, 0.0) for k in set(free) | set(u.demand)},
                   index.role[n])


def _sum(resources) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in resources:
        for k, v in r.items():
            out[k] += max(v, 0.0)
    return out
