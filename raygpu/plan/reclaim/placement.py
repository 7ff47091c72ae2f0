"""Placement units of a placement group, and an exhaustive search for a placement of them.

``units(pg)`` turns a PG's unplaced bundles into what must be placed:
STRICT_PACK one unit (the sum, on the node of a placed bundle if any),
STRICT_SPREAD one per bundle that never shares a node with another bundle of
the PG, PACK and SPREAD one per bundle anywhere (both are best effort in Ray:
any placement that fits will do). Largest GPU demand first.

``find_placement(units, index, ...)`` searches a
:class:`~raygpu.plan.common.free_index.FreeIndex` depth first for a node per unit. It
is exact: nodes of one bucket (same labels and free resources) that the
search has not touched yet are interchangeable, so one of each bucket is tried,
plus every node it already used. It stops after ``budget`` tries and then says
``UNKNOWN``, never "no" (``BUDGET`` tries by default).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from raygpu.model.views import PlacementGroupView
from raygpu.plan.common.free_index import CAND, FREE, FreeIndex, fits, matches_all

UNKNOWN = "unknown"  # the search ran out of budget: neither a placement nor a proof there is none
BUDGET = 2_000


@dataclass
class Unit:
    """What must go on one node: its demand, the label selectors that node must match, the nodes it may
    use (None: any), the nodes it must not use (shared by the units of one STRICT_SPREAD PG), whether
    it may share a node with another unit of its PG (``spread``: it may not), and which PG it belongs to
    (``owner``: units of several PGs searched together)."""

    demand: dict[str, float]
    selectors: list[dict[str, str]]
    allowed: set[str] | None
    excluded: set[str]
    spread: bool = False
    owner: int = 0


def units(pg: PlacementGroupView) -> list[Unit]:
    """The placement units of ``pg``'s unplaced bundles (fresh sets on every call)."""
    placed = {n for n in pg.bundle_node_ids if n}
    unplaced = [i for i in range(len(pg.bundles)) if i >= len(pg.bundle_node_ids) or not pg.bundle_node_ids[i]]
    unplaced.sort(key=lambda i: (-pg.bundles[i].get("GPU", 0.0), -pg.bundles[i].get("CPU", 0.0), i))
    sel = [pg.bundle_label_selectors[i] if i < len(pg.bundle_label_selectors) else {} for i in unplaced]
    if pg.strategy == "STRICT_PACK" and unplaced:
        total: dict[str, float] = defaultdict(float)
        for i in unplaced:
            for k, v in pg.bundles[i].items():
                total[k] += v
        return [Unit(dict(total), sel, placed or None, set())]
    excluded = placed if pg.strategy == "STRICT_SPREAD" else set()
    spread = pg.strategy == "STRICT_SPREAD"
    return [Unit(pg.bundles[i], [s], None, excluded, spread) for i, s in zip(unplaced, sel)]


def find_placement(us: list[Unit], index: FreeIndex, spare: dict[str, int], *, candidates_too: bool,
                   budget: int | None = None) -> list[str] | None | str:
    """A node per unit on the index's free resources, or None when there is none, or ``UNKNOWN``.

    Uses nodes of role ``free`` first, then (``candidates_too``) candidates in the planner's order; the index
    is not changed. The units may belong to several PGs (``Unit.owner``): a ``spread`` unit then only avoids
    the nodes of its own PG's units, and every node some unit names (``allowed``, ``excluded``) is tried by
    itself, since it is not interchangeable with the rest of its bucket.
    """
    budget = BUDGET if budget is None else budget
    left: dict[str, dict[str, float]] = {}  # node -> free resources after the units placed so far
    path: list[str] = []
    pinned: set[str] = set()
    if len({u.owner for u in us}) > 1:
        pinned = {n for u in us for n in u.excluded | (u.allowed or set()) if n in index.free}
    tries = 0

    def options(u: Unit) -> list[str]:
        banned = u.excluded | {n for n, o in zip(path, us) if o.owner == u.owner} if u.spread else u.excluded
        out: list[tuple[tuple, str]] = []

        def consider(n: str) -> None:
            role = index.role[n]
            if n in banned or (role == CAND and not candidates_too):
                return
            if fits(u.demand, left.get(n, index.free[n])) and matches_all(u.selectors, index.labels[n]):
                out.append((_order(index, n, spare), n))

        if u.allowed is not None:
            for n in sorted(u.allowed):
                if n in index.free:
                    consider(n)
        else:
            for n in sorted(left.keys() | pinned):
                consider(n)
            skip = banned | set(left) | pinned
            for b in index.buckets(u.demand, u.selectors):
                n = index.best_free(b, skip)
                if n is None and candidates_too:
                    n = min(index.best_cands(b, skip), key=lambda rc: (spare[index.group[rc[1]]] <= 0, rc[0]),
                            default=(None, None))[1]
                if n is not None:
                    out.append((_order(index, n, spare), n))
        return [n for _, n in sorted(out)]

    def place(j: int) -> bool | str:
        nonlocal tries
        if j == len(us):
            return True
        u = us[j]
        for n in options(u):
            tries += 1
            if tries > budget:
                return UNKNOWN
            before = left.get(n)
            have = before if before is not None else index.free[n]
            left[n] = {k: have.get(k, 0.0) - u.demand.get(k, 0.0) for k in set(have) | set(u.demand)}
            path.append(n)
            got = place(j + 1)
            if got:
                return got
            path.pop()
            if before is None:
                del left[n]
            else:
                left[n] = before
        return False

    got = place(0)
    if got is UNKNOWN:
        return UNKNOWN
    return list(path) if got else None


def _order(index: FreeIndex, n: str, spare: dict[str, int]) -> tuple:
    if index.role[n] == FREE:
        return (0, index.free[n].get("GPU", 0.0), n)
    return (1, spare[index.group[n]] <= 0, index.rank[n])


def could_host(index: FreeIndex, us: list[Unit]) -> set[str]:
    """Every candidate of ``index`` that could take one of ``us`` on its own (the keep-all of a search that
    ran out of budget)."""
    return {n for u in us for b in index.buckets(u.demand, u.selectors) for n in index.cands(b)
            if u.allowed is None or n in u.allowed}
