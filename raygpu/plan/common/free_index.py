"""Free Ray capacity bucketed by shape, so that a bundle finds its node without scanning every node.

Nodes with the same labels and the same free resources are interchangeable for
a bundle: a :class:`FreeIndex` keeps one bucket per such shape, and in each
bucket the nodes that stay (``free`` role) by node id and the idle candidates
(``cand`` role) per worker group by the planner's preference. A query checks
each bucket once (fit and label selectors) and reads the best node of each
fitting bucket from the top of a heap, so its cost grows with the number of
distinct shapes, not with the number of nodes. Entries are never removed from
a heap; an entry counts while its node is still in that bucket with that role,
and is dropped when it surfaces after the node moved (its free resources or
its role changed).

Pure helpers, no I/O; shared by the pending-placement-group simulation
(``plan.pending``) and its exact search (``plan.placement``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

EPS = 1e-9
FREE, CAND = "free", "cand"


def fits(demand: Mapping[str, float], have: Mapping[str, float]) -> bool:
    """Every positive demand is covered by ``have`` (missing keys count as 0)."""
    return all(have.get(k, 0.0) + EPS >= v for k, v in demand.items() if v > 0)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
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


def matches_all(selectors: list[dict[str, str]], labels: dict[str, str]) -> bool:
    return all(matches(s, labels) for s in selectors)


@dataclass
class _Bucket:
    key: tuple
    labels: dict[str, str]
    free: dict[str, float]
    live: int = 0
    free_heap: list[str] = field(default_factory=list)  # node ids
    cand_heaps: dict[str, list[tuple[tuple, str]]] = field(default_factory=dict)  # group -> (rank, node id)
    takes: dict[int, bool] = field(default_factory=dict)  # demand shape id -> fits and matches (see buckets)


class FreeIndex:
    """Nodes by shape (labels, free resources) and role; see the module docstring.

    ``add``/``move`` place a node; ``best_free`` and ``best_cand`` answer "which node of this role takes
    this demand", honouring an exclusion set (small: the nodes of one placement group). A heap entry is
    current while its node is in that bucket with that role; a node that comes back to a bucket may
    have two current entries there, which changes no answer (the same node, the same rank). Per node the
    index keeps no object of its own but its candidate rank entry: bucket keys are shared, free heaps hold
    the node ids themselves (at 20,000 Ray nodes a cycle builds it twice).
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple, _Bucket] = {}
        self._where: dict[str, tuple] = {}  # node id -> bucket key (the bucket's own, shared)
        self.labels: dict[str, dict[str, str]] = {}
        self._label_key: dict[str, tuple] = {}  # node id -> its labels sorted, computed once
        self.free: dict[str, dict[str, float]] = {}
        self.role: dict[str, str] = {}
        self.group: dict[str, str] = {}
        self.rank: dict[str, tuple] = {}
        # (demand items, selectors' items) -> a small id, for the buckets' memo of what their shape takes:
        # facts about a shape, so shared with every copy (as the buckets' memos are)
        self._shape_ids: dict[tuple, int] = {}

    @classmethod
    def build(cls, rows: Iterable[tuple[str, dict[str, str], dict[str, float], str, str, tuple, tuple[tuple, tuple]]]
              ) -> "FreeIndex":
        """An index of ``rows`` (node id, labels, free, role, group, rank, (labels sorted, free sorted)), in
        node id order, each node new: what ``add`` of each row in turn gives (the same nodes, buckets and
        heap entries), in one loop, each heap made at once."""
        out = cls()
        buckets, where = out._buckets, out._where
        for nid, labels, free, role, group, rank, (label_key, free_key) in rows:
            out.labels[nid], out._label_key[nid], out.group[nid], out.rank[nid] = labels, label_key, group, rank
            out.free[nid], out.role[nid] = free, role
            key = (label_key, free_key)
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = _Bucket(key, labels, free)
            bucket.live += 1
            where[nid] = bucket.key
            if role == FREE:
                bucket.free_heap.append(nid)
            else:
                bucket.cand_heaps.setdefault(group, []).append((rank, nid))
        for bucket in buckets.values():
            heapq.heapify(bucket.free_heap)  # already one when the rows come in node id order
            for heap in bucket.cand_heaps.values():
                heapq.heapify(heap)
        return out

    def add(self, node_id: str, labels: dict[str, str], free: dict[str, float], role: str,
            group: str = "", rank: tuple = (), keys: tuple[tuple, tuple] | None = None) -> None:
        """Place a new node. ``labels`` and ``free`` are kept, not copied: nothing here changes them.
        ``keys``: their items sorted (``shape_key``), when the caller has them already."""
        self.labels[node_id] = labels
        self._label_key[node_id] = keys[0] if keys is not None else tuple(sorted(labels.items()))
        self.group[node_id] = group
        self.rank[node_id] = rank
        self.move(node_id, free, role, keys[1] if keys is not None else None)

    def move(self, node_id: str, free: dict[str, float], role: str, free_key: tuple | None = None) -> None:
        """Give ``node_id`` new free resources and role (its old heap entries go stale); ``free_key``: the
        items of ``free`` sorted, when the caller has them."""
        old = self._where.get(node_id)
        if old is not None:
            bucket = self._buckets[old]
            bucket.live -= 1
            if bucket.live == 0:
                del self._buckets[old]
        self.free[node_id] = free
        self.role[node_id] = role
        key = (self._label_key[node_id], free_key if free_key is not None else tuple(sorted(free.items())))
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(key, self.labels[node_id], free)
        bucket.live += 1
        self._where[node_id] = bucket.key
        if role == FREE:
            heapq.heappush(bucket.free_heap, node_id)
        else:
            heapq.heappush(bucket.cand_heaps.setdefault(self.group[node_id], []), (self.rank[node_id], node_id))

    def free_key(self, node_id: str) -> tuple:
        """The items of the node's free resources sorted, as its bucket keys them (``move``'s ``free_key``)."""
        return self._where[node_id][1]

    def copy(self) -> "FreeIndex":
        """An independent copy (cheaper than adding every node again: nothing is re-sorted)."""
        out = FreeIndex()
        out._buckets = {k: _Bucket(b.key, b.labels, b.free, b.live, list(b.free_heap),
                                   {g: list(h) for g, h in b.cand_heaps.items()}, b.takes)
                        for k, b in self._buckets.items()}
        out._shape_ids = self._shape_ids
        out._where, out._label_key = dict(self._where), dict(self._label_key)
        out.labels, out.free, out.role = dict(self.labels), dict(self.free), dict(self.role)
        out.group, out.rank = dict(self.group), dict(self.rank)
        return out

    def buckets(self, demand: dict[str, float], selectors: list[dict[str, str]]):
        """The live buckets whose shape takes ``demand`` and matches every selector.

        A bucket's shape never changes, so each bucket judges each demand shape once (``_Bucket.takes``):
        a query costs one look per bucket, not a fit and a selector match."""
        key = (tuple(demand.items()), tuple(tuple(s.items()) for s in selectors))
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = len(self._shape_ids)
        out = []
        for b in self._buckets.values():
            ok = b.takes.get(sid)
            if ok is None:
                ok = b.takes[sid] = fits(demand, b.free) and matches_all(selectors, b.labels)
            if ok and b.live:
                out.append(b)
        return out

    def _current(self, bucket: _Bucket, node: str, role: str) -> bool:
        return self._where.get(node) is bucket.key and self._buckets.get(bucket.key) is bucket \
            and self.role[node] == role

    def best_free(self, bucket: _Bucket, skip: set[str] | frozenset[str]) -> str | None:
        """The lowest node id of the bucket's free role not in ``skip``."""
        return self._top(bucket, bucket.free_heap, skip, FREE, lambda e: e)

    def best_cands(self, bucket: _Bucket, skip: set[str] | frozenset[str]) -> list[tuple[tuple, str]]:
        """Per group, the most preferred candidate of the bucket not in ``skip``: [(rank, node id)]."""
        out = []
        for group, heap in bucket.cand_heaps.items():
            top = self._top(bucket, heap, skip, CAND, lambda e: e[1], group)
            if top:
                out.append(top)
        return out

    def cands(self, bucket: _Bucket) -> list[str]:
        """Every candidate of the bucket (one pass over its heaps)."""
        return sorted({e[1] for g, heap in bucket.cand_heaps.items() for e in heap
                       if self._current(bucket, e[1], CAND) and self.group[e[1]] == g})

    def _top(self, bucket: _Bucket, heap: list, skip, role: str, node_of, group: str | None = None):
        """The first current entry of ``heap`` whose node is not in ``skip`` (stale entries are dropped)."""
        held = []
        found = None
        while heap:
            entry = heap[0]
            node = node_of(entry)
            if not self._current(bucket, node, role) or (group is not None and self.group[node] != group):
                heapq.heappop(heap)  # stale: the node moved since
                continue
            if node in skip:
                held.append(heapq.heappop(heap))
                continue
            found = entry
            break
        for entry in held:
            heapq.heappush(heap, entry)
        return found
