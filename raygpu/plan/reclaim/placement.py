"""Placement units of a placement group, and an exhaustive search for a placement of them, on a step budget.

``units(pg)`` turns a PG's unplaced bundles into what must be placed:
STRICT_PACK one unit (the sum, on the node of a placed bundle if any),
STRICT_SPREAD one per bundle that never shares a node with another bundle of
the PG, PACK and SPREAD one per bundle anywhere (both are best effort in Ray:
any placement that fits will do). Largest GPU demand first.

``find_placement(units, index, ...)`` searches a
:class:`~raygpu.plan.common.free_index.FreeIndex` depth first for a node per unit, with an explicit stack
(no recursion: a search as deep as its units, thousands at a backlog, needs no Python frame per unit). It is
exact: a unit placed on a node moves that node to the bucket of what it has left, so nodes of one bucket
(same labels and free resources) are interchangeable for the units still to place and one of each bucket is
tried, plus the nodes some unit names (``allowed``, ``excluded``) one by one, never the nodes the unit's own
STRICT_SPREAD PG already uses. A step costs the same whatever the cluster's size: a
search charges one per unit it sets out to place and one per unit it puts on a node. A search stops after
one try per unit plus ``BUDGET`` more, or when the cycle's :class:`Steps` run out, and then says
``UNKNOWN``, never "no".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from raygpu.model.views import PlacementGroupView
from raygpu.plan.common.free_index import CAND, FREE, FreeIndex, fits, matches_all

UNKNOWN = "unknown"  # the search ran out of budget: neither a placement nor a proof there is none
BUDGET = 2_000  # steps one search may take beyond one per unit (its backtracking)
# steps one cycle's pending-PG proof may take, all searches together (see docs/reliability.md, "The budget
# rule", for what the benchmark's backlogs take at 10,000 nodes)
CYCLE_STEPS = 200_000


class Steps:
    """The placement steps one cycle's pending-PG proof may still take, shared by all its searches.

    ``limit``: ``CYCLE_STEPS`` when None. ``spent`` says why the planner had to keep what it could not judge
    (``plan.pending``): the cycle's steps ran out, or a search with candidates ran past its own ``BUDGET``
    ('' when neither happened)."""

    def __init__(self, limit: int | None = None) -> None:
        limit = CYCLE_STEPS if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"a step budget is a count of placement steps, an int >= 0: got {limit!r}")
        self.limit = limit
        self.taken = 0
        self._search = ""  # the first search with candidates that ran past its own budget

    @property
    def exhausted(self) -> bool:
        return self.taken > self.limit

    @property
    def spent(self) -> str:
        if self.exhausted:
            return f"the cycle's {self.limit:,} placement steps ran out"
        return self._search

    def search_ran_out(self, why: str) -> None:
        """A search with candidates ran past its own budget: its caller keeps what it could not judge."""
        self._search = self._search or why


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


def signature(us: list[Unit]) -> tuple:
    """What a search of ``us`` depends on besides the index: equal signatures, equal answers on one index."""
    return tuple((tuple(u.demand.items()), tuple(tuple(s.items()) for s in u.selectors),
                  None if u.allowed is None else tuple(sorted(u.allowed)), tuple(sorted(u.excluded)), u.spread,
                  u.owner) for u in us)


class Shapes:
    """Each pending PG's units and their signature, worked out once per PG shape (strategy, bundles, label
    selectors, nodes of its placed bundles) for one cycle: a backlog is thousands of PGs of a few shapes.
    The units are shared between the PGs of a shape: a caller must not change them."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, tuple[list[Unit], tuple]] = {}
        self._by_pg: dict[int, tuple[list[Unit], tuple]] = {}  # by the PG object (alive for the cycle)

    def of(self, pg: PlacementGroupView) -> tuple[list[Unit], tuple]:
        got = self._by_pg.get(id(pg))
        if got is not None:
            return got
        key = (pg.strategy, tuple(map(tuple, map(dict.items, pg.bundles))),
               tuple(map(tuple, map(dict.items, pg.bundle_label_selectors))), pg.bundle_node_ids)
        got = self._by_key.get(key)
        if got is None:
            us = units(pg)
            got = self._by_key[key] = (us, signature(us))
        self._by_pg[id(pg)] = got
        return got


def find_placement(us: list[Unit], index: FreeIndex, spare: dict[str, int], *, candidates_too: bool,
                   steps: Steps | None = None) -> list[str] | None | str:
    """A node per unit on the index's free resources, or None when there is none, or ``UNKNOWN``.

    Uses nodes of role ``free`` first, then (``candidates_too``) candidates in the planner's order. The index
    is changed while the search runs (a unit placed moves its node) and is as it was when it returns. The
    units may belong to several PGs (``Unit.owner``, the units of one PG next to each other): a ``spread``
    unit then only avoids the nodes of its own PG's units, and every node some unit names (``allowed``,
    ``excluded``) is tried by itself, since it is not interchangeable with the rest of its bucket.
    ``steps``: the cycle's step budget, charged one per step (the search says ``UNKNOWN`` when it runs out).
    """
    if not us:
        return []
    if steps is not None:  # setting out costs a step per unit: a search that places nothing is not free
        steps.taken += len(us)
        if steps.exhausted:
            return UNKNOWN
    owners = [u.owner for u in us]
    starts: list[int] = []  # per unit, where its PG's units begin
    for j, o in enumerate(owners):
        starts.append(j if j == 0 or owners[j - 1] != o else starts[-1])
    if len(set(owners)) != sum(1 for j, s in enumerate(starts) if s == j):
        raise ValueError("find_placement: the units of one owner must be next to each other")
    cap = len(us) + BUDGET
    pinned: set[str] = set()
    if starts[-1] != 0:  # several PGs
        pinned = {n for u in us for n in u.excluded | (u.allowed or set()) if n in index.free}
    path: list[str] = []
    undo: list[tuple[str, dict[str, float], tuple]] = []  # per placed unit: its node's free resources before
    tries = 0

    def options(j: int) -> list[str]:
        """The nodes to try for unit ``j``, the one to try first last."""
        u = us[j]
        banned = u.excluded | set(path[starts[j]:j]) if u.spread else u.excluded
        out: list[tuple[tuple, str]] = []

        def consider(n: str) -> None:
            if n in banned or (index.role[n] == CAND and not candidates_too):
                return
            if fits(u.demand, index.free[n]) and matches_all(u.selectors, index.labels[n]):
                out.append((_order(index, n, spare), n))

        if u.allowed is not None:
            for n in sorted(u.allowed):
                if n in index.free:
                    consider(n)
        else:
            for n in sorted(pinned):
                consider(n)
            skip = banned | pinned
            for b in index.buckets(u.demand, u.selectors):
                n = index.best_free(b, skip)
                if n is None and candidates_too:
                    n = min(index.best_cands(b, skip), key=lambda rc: (spare[index.group[rc[1]]] <= 0, rc[0]),
                            default=(None, None))[1]
                if n is not None:
                    out.append((_order(index, n, spare), n))
        out.sort(reverse=True)
        return [n for _, n in out]

    def take(j: int, n: str) -> None:
        undo.append((n, index.free[n], index.free_key(n)))
        index.less(n, us[j].demand)
        path.append(n)

    def give_back() -> None:
        n, have, key = undo.pop()
        index.move(n, have, index.role[n], key)
        path.pop()

    stack = [options(0)]  # per unit placed so far and the next one: the nodes still to try for it
    found: list[str] | None | str = None
    try:
        while stack:
            todo = stack[-1]
            if not todo:  # every node tried for this unit: back to the one before
                stack.pop()
                if path:
                    give_back()
                continue
            tries += 1
            if steps is not None:
                steps.taken += 1
                if steps.exhausted:
                    found = UNKNOWN
                    break
            if tries > cap:
                # without candidates it is only a preference, and the caller searches again with them
                if steps is not None and candidates_too:
                    steps.search_ran_out(f"a search of {len(us):,} bundles ran past its {cap:,} steps")
                found = UNKNOWN
                break
            take(len(path), todo.pop())
            if len(path) == len(us):
                found = list(path)
                break
            stack.append(options(len(path)))
    finally:
        while undo:
            give_back()
    return found


def _order(index: FreeIndex, n: str, spare: dict[str, int]) -> tuple:
    if index.role[n] == FREE:
        return (0, index.free[n].get("GPU", 0.0), n)
    return (1, spare[index.group[n]] <= 0, index.rank[n])


def could_host(index: FreeIndex, us: list[Unit]) -> set[str]:
    """Every candidate of ``index`` that could take one of ``us`` on its own (the keep-all of a search that
    ran out of budget)."""
    return {n for u in us for b in index.buckets(u.demand, u.selectors) for n in index.cands(b)
            if u.allowed is None or n in u.allowed}
